// Command vgpuha is the agent that runs on every GPU host: primary,
// standby, status, verify, switchover, run, version and completion. It
// links no test kit, workload, etcd server or plotting library
// (TestAgentDependencies holds it to that).
//
// Built with -tags lab (make lab: bin/vgpuha-lab) the same command also
// carries the lab, in the lab_*.go files: example guests, the demo,
// failover drills, benchmarks, MMIO guests and embedded etcd members. The
// lab binary runs the agent's commands too, so a drill's nodes are the
// agent's own code.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strings"
)

type command struct {
	summary string
	run     func(args []string) error
}

var commands = map[string]command{
	"primary":    {"serve guests' GPU calls on the local backend", runPrimary},
	"standby":    {"apply a primary's replication stream to a replica GPU", runStandby},
	"verify":     {"compare every object on primary and standby (and repair)", runVerify},
	"switchover": {"hand the primary role to the standby with nothing lost (maintenance, migration)", runSwitchover},
	"run":        {"serve one guest program started here, tracing its aperture writes: run [flags] -- PROGRAM ARGS", runRun},
	"version":    {"print the version and the commit it was built from", runVersion},
	"status":     {"one node's status (--admin), or every replication group's members from the coordinator (etcd)", runStatus},
}

// progName and progSummary name the binary in its usage and errors (the
// lab build sets its own: lab.go).
var (
	progName    = "vgpuha"
	progSummary = "vgpuha keeps a guest's GPU state alive when its host dies: the agent that runs on every GPU host."
)

// subcommands are commands that take a subcommand word (bench NAME):
// completion offers each.
var subcommands = map[string]map[string]command{}

func usage(w io.Writer) {
	fmt.Fprintf(w, "%s\n\nUsage: %s COMMAND [flags]\n\nCommands:\n", progSummary, progName)
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintf(w, "\nRun '%[1]s help COMMAND' (or '%[1]s COMMAND --help') for a command's flags.\n", progName)
}

func main() { os.Exit(run(os.Args[1:])) }

// run runs one command line and returns the exit status: 0, 1 for a failed
// command, 2 for a usage error (an unknown flag, a refused value: one line
// on stderr). Help goes to stdout with status 0.
func run(args []string) int {
	args, status, done := topLevel(args)
	if done {
		return status
	}
	cmd, ok := commands[args[0]]
	if !ok {
		hint := ""
		if s := closest(args[0], commandNames()); s != "" {
			hint = fmt.Sprintf(" (did you mean %s?)", s)
		}
		fmt.Fprintf(os.Stderr, "%[1]s: unknown command %[2]q%[3]s; '%[1]s help' lists the commands\n", progName, args[0], hint)
		return 2
	}
	helpWanted = wantsHelp(args[1:])
	return exitStatus(args[0], cmd.run(args[1:]))
}

// topLevel handles what comes before a command: no arguments, --help,
// --version and help COMMAND. done: the status is final.
func topLevel(args []string) (rest []string, status int, done bool) {
	if len(args) == 0 {
		usage(os.Stderr)
		return nil, 2, true
	}
	switch args[0] {
	case "-h", "--help", "-help":
		usage(os.Stdout)
		return nil, 0, true
	case "--version", "-version":
		return []string{"version"}, 0, false
	case "help":
		if len(args) == 1 {
			usage(os.Stdout)
			return nil, 0, true
		}
		return []string{args[1], "--help"}, 0, false
	}
	return args, 0, false
}

// exitStatus prints a command's error (one line) and returns its status.
func exitStatus(name string, err error) int {
	if err == nil {
		return 0
	}
	if errors.Is(err, flag.ErrHelp) {
		if helpWanted {
			return 0
		}
		return 2
	}
	fmt.Fprintf(os.Stderr, "%s %s: %v\n", progName, name, err)
	if errors.As(err, new(usageError)) {
		return 2
	}
	var exit exitError
	if errors.As(err, &exit) {
		return exit.code
	}
	return 1
}

// helpWanted: the command line asked for help, which then goes to stdout.
var helpWanted bool

// wantsHelp reports whether args ask for help before any "--".
func wantsHelp(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-h", "--help", "-help":
			return true
		}
	}
	return false
}

// newFlags returns a flag set whose --help names the command and lists its
// flags with two dashes, on stdout when help was asked for. A refused flag
// prints nothing here: parseFlags words it, and run prints that one line.
func newFlags(name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	switch {
	case capturedFlags != nil:
		*capturedFlags = append(*capturedFlags, fs)
	case helpWanted:
		fs.SetOutput(os.Stdout)
	}
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: %s %s %s\n\nFlags:\n", progName, name, synopsis)
		printFlags(fs)
	}
	return fs
}

// printFlags lists fs's flags as --name TYPE, usage and default.
func printFlags(fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		typ, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if typ != "" {
			line += " " + typ
		}
		line += "\n    \t" + strings.ReplaceAll(usage, "\n", "\n    \t")
		if d := f.DefValue; d != "" && d != "false" && d != "0" {
			line += fmt.Sprintf(" (default %s)", d)
		}
		fmt.Fprintln(fs.Output(), line)
	})
}

// logFlag adds --log.level and --log.format (checked when the flags are
// parsed) and returns a constructor for the logger.
func logFlag(fs *flag.FlagSet) func() *slog.Logger {
	level := &choice{value: "info", allowed: []string{"debug", "info", "warn", "error"}}
	format := &choice{value: "text", allowed: []string{"text", "json"}}
	fs.Var(level, "log.level", "log level: debug, info, warn or error")
	fs.Var(format, "log.format", "log format: text or json")
	return func() *slog.Logger {
		var l slog.Level
		l.UnmarshalText([]byte(strings.ToUpper(level.value))) // one of the allowed names
		opts := &slog.HandlerOptions{Level: l}
		if format.value == "json" {
			return slog.New(slog.NewJSONHandler(os.Stderr, opts))
		}
		return slog.New(slog.NewTextHandler(os.Stderr, opts))
	}
}

// exitError ends vgpuha with its own exit status (a deposed primary's
// refusal to start: contrib/systemd keeps it from restarting).
type exitError struct {
	err  error
	code int
}

func (e exitError) Error() string { return e.err.Error() }
func (e exitError) Unwrap() error { return e.err }

// choice is a flag whose value is one of a fixed set of words.
type choice struct {
	value   string
	allowed []string
}

func (c *choice) String() string { return c.value }

func (c *choice) Set(v string) error {
	if !slices.Contains(c.allowed, v) {
		return fmt.Errorf("want %s", strings.Join(c.allowed, ", "))
	}
	c.value = v
	return nil
}
