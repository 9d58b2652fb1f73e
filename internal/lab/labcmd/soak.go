package labcmd

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/vgpuha/vgpuha/internal/agent"
	"github.com/vgpuha/vgpuha/internal/cli"
	"github.com/vgpuha/vgpuha/internal/lab/drill/soak"
)

// runSoak runs soak.Run: a two-node pair on loopback whose primary is
// killed again and again under guests, and prints what it counted.
func runSoak(args []string) error {
	fs := cli.NewFlags("soak", "[flags]")
	duration := cli.Duration(fs, "duration", 10*time.Minute, 10*time.Second, 24*time.Hour, "how long to soak")
	killMin := cli.Duration(fs, "kill.min", 5*time.Second, time.Second, time.Hour, "least time between SIGKILLs of the primary")
	killMax := cli.Duration(fs, "kill.max", 20*time.Second, time.Second, time.Hour, "most time between SIGKILLs of the primary")
	midHello := cli.Duration(fs, "mid-hello-every", time.Minute, time.Second, time.Hour, "a guest dies right after its hello this often")
	grace := cli.Duration(fs, "guest.max-grace", 5*time.Second, time.Second, time.Hour, "both nodes' --guest.max-grace")
	backendName := cli.String(fs, "backend", "auto", agent.CheckBackend, "GPU backend of both nodes")
	seed := cli.Int[uint64](fs, "seed", 1, 0, cli.MaxUint64, "seed for the moments of the kills")
	if err := cli.Parse(fs, args); err != nil {
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
