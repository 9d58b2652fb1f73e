// Command vgpuha runs every vgpuha role from one binary: the primary
// hypervisor backend, example guests, the demo and the benchmarks.
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
)

type command struct {
	summary string
	run     func(args []string) error
}

var commands = map[string]command{
	"primary":    {"serve guests' GPU calls on the local backend", runPrimary},
	"guest":      {"run an example guest workload through pvdriver and verify it", runGuest},
	"demo":       {"start a primary and run every workload against it on loopback", runDemo},
	"bench":      {"run a benchmark (pv, replicate, apply, mmio)", runBench},
	"standby":    {"apply a primary's replication stream to a replica GPU", runStandby},
	"verify":     {"compare every object on primary and standby (and repair)", runVerify},
	"switchover": {"hand the primary role to the standby with nothing lost (maintenance, migration)", runSwitchover},
	"drill":      {"inject faults into a primary/standby pair under a guest workload and measure", runDrill},
	"run":        {"serve one guest program started here, tracing its aperture writes: run [flags] -- PROGRAM ARGS", runRun},
	"mmio-guest": {"a guest that writes to apertures (the MMIO benchmark's workloads)", runMMIOGuest},
	"status":     {"list replication groups, roles, terms, lag and pool members from the coordinator (etcd)", runStatus},
}

func usage() {
	fmt.Fprintf(os.Stderr, "vgpuha keeps a guest's GPU state alive when its host dies.\n\nUsage: vgpuha COMMAND [flags]\n\nCommands:\n")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintf(os.Stderr, "\nRun 'vgpuha COMMAND --help' for a command's flags.\n")
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage()
		os.Exit(2)
	}
	cmd, ok := commands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "vgpuha: unknown command %q\n\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	if err := cmd.run(os.Args[2:]); err != nil {
		if err == flag.ErrHelp {
			os.Exit(2)
		}
		fmt.Fprintf(os.Stderr, "vgpuha %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

// newFlags returns a flag set whose --help names the command.
func newFlags(name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: vgpuha %s %s\n\nFlags:\n", name, synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// logFlag adds --log.level and returns a constructor for the logger.
func logFlag(fs *flag.FlagSet) func() *slog.Logger {
	level := fs.String("log.level", "info", "log level: debug, info, warn or error")
	return func() *slog.Logger {
		var l slog.Level
		if err := l.UnmarshalText([]byte(strings.ToUpper(*level))); err != nil {
			l = slog.LevelInfo
		}
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l}))
	}
}
