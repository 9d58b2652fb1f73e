package labcmd

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/vgpuha/vgpuha/internal/agent"
	"github.com/vgpuha/vgpuha/internal/cli"
	"github.com/vgpuha/vgpuha/internal/lab/drill"
)

// runDemo shows the product's point on one machine: it starts a standby and
// a primary as separate processes (the embedded default: the software GPU
// unless a GPU is present, everything on loopback), runs every workload
// through a guest, SIGKILLs the primary in the middle of the second round,
// and the guest finishes on the promoted standby with verified results.
func runDemo(args []string) error {
	fs := cli.NewFlags("demo", "[flags]")
	backendName := cli.String(fs, "backend", "auto", agent.CheckBackend, "GPU backend for both nodes: auto, cuda or sim")
	mode := cli.Choice(fs, "mode", "commit", agent.ReplicationModes, "replication mode: sync, commit, async or epoch")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	bin, err := os.Executable()
	if err != nil {
		return err
	}
	res, err := drill.Demo(drill.DemoOptions{Binary: bin, Backend: *backendName, Mode: *mode})
	if res != nil {
		printDemo(res, *mode)
	}
	return err
}

func printDemo(res *drill.DemoResult, mode string) {
	fmt.Printf("primary (pid %d) and standby (pid %d) up: %s backend, %s mode, protected\n", res.PrimaryPID, res.StandbyPID, res.Backend, mode)
	fmt.Printf("round 1 on the primary: %d workloads, all verified: %v\n", len(res.Round1), res.Round1Verified)
	fmt.Printf("SIGKILL primary after %s in round 2\n", res.KilledAfter)
	fmt.Println()
	printResults(os.Stdout, res.Round2)
	fmt.Println("\ntimeline:")
	fmt.Printf("  t=0        primary killed\n")
	if p := res.Promotion; p != nil {
		fmt.Printf("  +%-8s  standby detected the silence (%.0f ms without a heartbeat) and was promoted to term %d in %.1f ms\n",
			p.Serving.Sub(res.Killed).Round(time.Millisecond), p.DetectionSeconds*1000, p.Term, p.PromotionSeconds*1000)
	}
	for _, f := range res.Failovers {
		fmt.Printf("  +%-8s  guest resumed its session on %s (resent %d requests); guest paused for %v\n",
			f.Resumed.Sub(res.Killed).Round(time.Millisecond), strings.TrimPrefix(f.Endpoint, "unix://"), f.Resent, f.Resumed.Sub(f.Lost).Round(time.Millisecond))
	}
	fmt.Printf("\nround 2 finished on the promoted standby (%s); results verified and identical to round 1: %v\n", res.StandbyRole, res.Round2Verified)
	fmt.Printf("aperture guest (pid %d, writes traced in %s mode): %d stores to mapped device memory, half of them after the primary died;\n"+
		"  resumed on the standby (%d failover), whose device copy equals everything it wrote: %v\n",
		res.AperturePID, res.Aperture.Mode, res.Aperture.Writes, res.Aperture.Failovers, res.Aperture.Verified)
}
