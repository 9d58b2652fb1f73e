//go:build lab

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/vgpuha/vgpuha/internal/lab/drill/soak"
)

func init() {
	commands["soak"] = command{"kill the primary of a two-node pair again and again under guests; count lost writes, leaked sessions, refusals", runSoak}
}

// runSoak runs soak.Run: a two-node pair on loopback whose primary is
// killed again and again under guests, and prints what it counted.
func runSoak(args []string) error {
	fs := newFlags("soak", "[flags]")
	duration := durationFlag(fs, "duration", 10*time.Minute, 10*time.Second, 24*time.Hour, "how long to soak")
	killMin := durationFlag(fs, "kill.min", 5*time.Second, time.Second, time.Hour, "least time between SIGKILLs of the primary")
	killMax := durationFlag(fs, "kill.max", 20*time.Second, time.Second, time.Hour, "most time between SIGKILLs of the primary")
	midHello := durationFlag(fs, "mid-hello-every", time.Minute, time.Second, time.Hour, "a guest dies right after its hello this often")
	grace := durationFlag(fs, "guest.max-grace", 5*time.Second, time.Second, time.Hour, "both nodes' --guest.max-grace")
	backendName := stringFlag(fs, "backend", "auto", checkBackend, "GPU backend of both nodes")
	seed := intFlag[uint64](fs, "seed", 1, 0, maxUint64, "seed for the moments of the kills")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *killMax < *killMin {
		return fmt.Errorf("--kill.max %v is below --kill.min %v", *killMax, *killMin)
	}
	bin, err := os.Executable()
	if err != nil {
		return err
	}
	rep, err := soak.Run(soak.Options{Binary: bin, Backend: *backendName, Duration: *duration, KillMin: *killMin, KillMax: *killMax,
		MidHelloEvery: *midHello, Grace: *grace, Seed: *seed, Note: func(s string) { fmt.Fprintln(os.Stderr, s) }})
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	enc.Encode(rep)
	if err != nil {
		return err
	}
	return rep.Verdict()
}
