package labcmd

import (
	"os"
	"slices"
	"strings"

	"github.com/vgpuha/vgpuha/internal/agent"
	"github.com/vgpuha/vgpuha/internal/cli"
	"github.com/vgpuha/vgpuha/internal/lab/mmioguest"
)

// runMMIOGuest is `vgpuha mmio-guest`: the benchmark's guest program.
func runMMIOGuest(args []string) error {
	fs := cli.NewFlags("mmio-guest", "--addr ENDPOINT [flags]")
	var opts mmioguest.Options
	cli.StringVar(fs, &opts.Endpoint, "addr", os.Getenv("VGPUHA_ADDR"), agent.CheckEndpoint, "hypervisor endpoint (unix://PATH); default $VGPUHA_ADDR")
	workloads := append(slices.Clone(mmioguest.Workloads), "failover")
	workloadName := cli.Choice(fs, "workload", "seq", workloads, "one of "+strings.Join(workloads, ", ")+" (failover: pauses for a line on stdin halfway)")
	cli.IntVar(fs, &opts.Writes, "writes", 20000, 1, 1<<30, "stores to make")
	cli.SizeVar(fs, &opts.ApertureBytes, "aperture-bytes", 4<<20, 4096, 1<<34, "size of the memory aperture")
	cli.IntVar(fs, &opts.Threads, "threads", 4, 1, 1024, "OS threads storing at once (threads workload)")
	hold := fs.Bool("hold", false, "after the run, print the result and keep the session and apertures until killed")
	failoverTo := cli.String(fs, "failover", "", agent.CheckEndpoint, "a standby endpoint to resume on if the primary fails")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	opts.Workload = *workloadName
	return mmioguest.Main(opts, *hold, *failoverTo, os.Stdout)
}
