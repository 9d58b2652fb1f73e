// Package cli is the command-line kit of vgpuha's two binaries, the agent
// (cmd/vgpuha) and the lab tool (cmd/vgpuha-lab): a program's table of
// commands and its exit statuses, help, flags whose every value is checked
// when it is set, config files and VGPUHA_* variables, and shell
// completion generated from the commands' own flag sets.
//
// It owns no command: each binary assembles its Program from the packages
// that do (internal/agent, internal/lab/labcmd). It must never import a
// product package above the standard library and its TOML parser, so
// that both binaries can share it.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
)

// Command is one word of a program's command line.
type Command struct {
	Summary string
	Run     func(args []string) error
	// Sub names a command's own commands (bench NAME), which completion
	// offers; Run still parses them.
	Sub map[string]Command
}

// Program is one binary's command line.
type Program struct {
	Name     string // in usage and errors: vgpuha, vgpuha-lab
	Summary  string // the first line of its usage
	Commands map[string]Command
}

// current is the program running (Run sets it): flag sets and completion
// name it.
var current = &Program{Name: "vgpuha"}

// Name is the running program's name.
func Name() string { return current.Name }

// Main runs the program on os.Args and exits with its status.
func (p *Program) Main() { os.Exit(p.Run(os.Args[1:])) }

// Run runs one command line and returns the exit status: 0, 1 for a failed
// command, 2 for a usage error (an unknown flag, a refused value: one line
// on stderr). Help goes to stdout with status 0. Every program has the
// completion command.
func (p *Program) Run(args []string) int {
	current = p
	if _, ok := p.Commands["completion"]; !ok {
		p.Commands["completion"] = Command{Summary: "print a shell completion script: completion bash|zsh|fish", Run: runCompletion}
	}
	args, status, done := p.topLevel(args)
	if done {
		return status
	}
	cmd, ok := p.Commands[args[0]]
	if !ok {
		hint := ""
		if s := Closest(args[0], p.names()); s != "" {
			hint = fmt.Sprintf(" (did you mean %s?)", s)
		}
		fmt.Fprintf(os.Stderr, "%[1]s: unknown command %[2]q%[3]s; '%[1]s help' lists the commands\n", p.Name, args[0], hint)
		return 2
	}
	helpWanted = wantsHelp(args[1:])
	return p.exitStatus(args[0], cmd.Run(args[1:]))
}

// names are the top-level commands, sorted.
func (p *Program) names() []string { return slices.Sorted(maps.Keys(p.Commands)) }

func (p *Program) usage(w io.Writer) {
	fmt.Fprintf(w, "%s\n\nUsage: %s COMMAND [flags]\n\nCommands:\n", p.Summary, p.Name)
	for _, n := range p.names() {
		fmt.Fprintf(w, "  %-10s %s\n", n, p.Commands[n].Summary)
	}
	fmt.Fprintf(w, "\nRun '%[1]s help COMMAND' (or '%[1]s COMMAND --help') for a command's flags.\n", p.Name)
}

// topLevel handles what comes before a command: no arguments, --help,
// --version and help COMMAND. done: the status is final.
func (p *Program) topLevel(args []string) (rest []string, status int, done bool) {
	if len(args) == 0 {
		p.usage(os.Stderr)
		return nil, 2, true
	}
	switch args[0] {
	case "-h", "--help", "-help":
		p.usage(os.Stdout)
		return nil, 0, true
	case "--version", "-version":
		return []string{"version"}, 0, false
	case "help":
		if len(args) == 1 {
			p.usage(os.Stdout)
			return nil, 0, true
		}
		return []string{args[1], "--help"}, 0, false
	}
	return args, 0, false
}

// exitStatus prints a command's error (one line) and returns its status.
func (p *Program) exitStatus(name string, err error) int {
	if err == nil {
		return 0
	}
	if errors.Is(err, flag.ErrHelp) {
		if helpWanted {
			return 0
		}
		return 2
	}
	fmt.Fprintf(os.Stderr, "%s %s: %v\n", p.Name, name, err)
	if errors.As(err, new(usageError)) {
		return 2
	}
	var exit ExitError
	if errors.As(err, &exit) {
		return exit.Code
	}
	return 1
}

// helpWanted: the command line asked for help, which then goes to stdout.
var helpWanted bool

// HelpWanted reports whether the command line asked for help.
func HelpWanted() bool { return helpWanted }

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

// NewFlags returns a flag set whose --help names the command and lists its
// flags with two dashes, on stdout when help was asked for. A refused flag
// prints nothing here: Parse words it, and Run prints that one line.
func NewFlags(name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	switch {
	case capturedFlags != nil:
		*capturedFlags = append(*capturedFlags, fs)
	case helpWanted:
		fs.SetOutput(os.Stdout)
	}
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: %s %s %s\n\nFlags:\n", current.Name, name, synopsis)
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

// ExitError ends the program with its own exit status (a deposed
// primary's refusal to start: contrib/systemd keeps it from restarting).
type ExitError struct {
	Err  error
	Code int
}

func (e ExitError) Error() string { return e.Err.Error() }
func (e ExitError) Unwrap() error { return e.Err }
