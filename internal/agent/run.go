package agent

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/internal/cli"
	"github.com/vgpuha/vgpuha/mmiotrace"
)

// runRun is `vgpuha run [primary flags] -- PROGRAM ARGS`: a primary that
// serves one guest program it starts itself (with $VGPUHA_ADDR pointing at
// it), tracing the program's aperture writes, until the program exits.
func runRun(args []string) error {
	split := -1
	for i, a := range args {
		if a == "--" {
			split = i
			break
		}
	}
	if split < 0 && cli.HelpWanted() {
		return servePrimary(cli.NewFlags("run", "[primary flags] -- PROGRAM [ARGS]"), args, []string{})
	}
	if split < 0 || split == len(args)-1 {
		return cli.Usage(errors.New("usage: vgpuha run [primary flags] -- PROGRAM [ARGS]"))
	}
	fs := cli.NewFlags("run", "[primary flags] -- PROGRAM [ARGS]")
	return servePrimary(fs, args[:split], args[split+1:])
}

// startGuestProgram starts the guest in a process group of its own (the
// tracer waits on that group) and reports its exit.
func startGuestProgram(argv []string, endpoint string, mmio hypervisor.MMIOConfig) (<-chan error, error) {
	cmd := mmiotrace.GuestCommand(exec.Command(argv[0], argv[1:]...))
	cmd.Env = append(os.Environ(), "VGPUHA_ADDR="+endpoint)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	pin := "not pinned"
	if mmio.Pin && (mmio.Mode == mmiotrace.ModeInsn || mmio.Mode == mmiotrace.ModeAuto) {
		pin = "the tracer and the guest's threads pinned to one CPU (per-write tracing is 3-4x cheaper; --mmio.pin=false to stop)"
	}
	fmt.Fprintf(os.Stderr, "vgpuha run: %s (pid %d) on %s; apertures traced in %s mode, %s\n",
		argv[0], cmd.Process.Pid, endpoint, mmio.Mode, pin)
	done := make(chan error, 1)
	go func() { done <- mmiotrace.WaitExit(cmd) }()
	return done, nil
}

// guestProgram is node.RunConfig.OnReady for vgpuha run: it starts the
// guest program once the node serves; when the program exits it prints
// what the tracer did, and the node stops.
func guestProgram(argv []string, endpoint string, mmio hypervisor.MMIOConfig, reg prometheus.Gatherer) func() (<-chan error, error) {
	return func() (<-chan error, error) {
		exited, err := startGuestProgram(argv, endpoint, mmio)
		if err != nil {
			return nil, err
		}
		done := make(chan error, 1)
		go func() {
			err := <-exited
			printMMIOSummary(reg, mmio.Mode)
			done <- err
		}()
		return done, nil
	}
}

// printMMIOSummary reports the tracer's counters after the guest exited.
func printMMIOSummary(reg prometheus.Gatherer, mode mmiotrace.Mode) {
	var parts []string
	for name, total := range mmiotrace.SumCounters(reg) {
		if strings.HasPrefix(name, "vgpuha_mmio_") && strings.HasSuffix(name, "_total") {
			parts = append(parts, fmt.Sprintf("%s=%.0f", strings.TrimSuffix(strings.TrimPrefix(name, "vgpuha_mmio_"), "_total"), total))
		}
	}
	sort.Strings(parts)
	fmt.Fprintf(os.Stderr, "vgpuha run: guest exited; mmio (%s): %s\n", mode, strings.Join(parts, " "))
}
