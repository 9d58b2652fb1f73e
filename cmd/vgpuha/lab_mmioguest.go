//go:build lab

package main

import (
	"os"
	"slices"
	"strings"

	"github.com/vgpuha/vgpuha/internal/lab/mmioguest"
)

func init() {
	commands["mmio-guest"] = command{"a guest that writes to apertures (the MMIO benchmark's workloads)", runMMIOGuest}
}

// runMMIOGuest is `vgpuha mmio-guest`: the benchmark's guest program.
func runMMIOGuest(args []string) error {
	fs := newFlags("mmio-guest", "--addr ENDPOINT [flags]")
	var opts mmioguest.Options
	stringVar(fs, &opts.Endpoint, "addr", os.Getenv("VGPUHA_ADDR"), checkEndpoint, "hypervisor endpoint (unix://PATH); default $VGPUHA_ADDR")
	workloads := append(slices.Clone(mmioguest.Workloads), "failover")
	workloadName := choiceFlag(fs, "workload", "seq", workloads, "one of "+strings.Join(workloads, ", ")+" (failover: pauses for a line on stdin halfway)")
	intVar(fs, &opts.Writes, "writes", 20000, 1, 1<<30, "stores to make")
	sizeVar(fs, &opts.ApertureBytes, "aperture-bytes", 4<<20, 4096, 1<<34, "size of the memory aperture")
	intVar(fs, &opts.Threads, "threads", 4, 1, 1024, "OS threads storing at once (threads workload)")
	hold := fs.Bool("hold", false, "after the run, print the result and keep the session and apertures until killed")
	failoverTo := stringFlag(fs, "failover", "", checkEndpoint, "a standby endpoint to resume on if the primary fails")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	opts.Workload = *workloadName
	return mmioguest.Main(opts, *hold, *failoverTo, os.Stdout)
}
