package cli

import (
	"errors"
	"testing"
)

// TestExitStatuses: a program's exit status says what went wrong: 0 for
// success and asked-for help, 1 for a failed command, 2 for a usage error
// (an unknown command or flag, a refused value, help nobody asked for),
// and a command's own status through ExitError.
func TestExitStatuses(t *testing.T) {
	p := &Program{Name: "toy", Summary: "a toy program", Commands: map[string]Command{
		"ok":      {Summary: "succeeds", Run: func([]string) error { return nil }},
		"fail":    {Summary: "fails", Run: func([]string) error { return errors.New("broken") }},
		"deposed": {Summary: "exits 3", Run: func([]string) error { return ExitError{Err: errors.New("deposed"), Code: 3} }},
		"count": {Summary: "takes --n in [1, 9]", Run: func(args []string) error {
			fs := NewFlags("count", "[flags]")
			Int(fs, "n", 1, 1, 9, "a count")
			return Parse(fs, args)
		}},
	}}
	for _, c := range []struct {
		args []string
		want int
	}{
		{[]string{"ok"}, 0},
		{[]string{"fail"}, 1},
		{[]string{"deposed"}, 3},
		{[]string{"count", "--n", "5"}, 0},
		{[]string{"count", "--n", "10"}, 2},
		{[]string{"count", "--m", "5"}, 2},
		{[]string{"count", "--help"}, 0},
		{[]string{"help", "count"}, 0},
		{[]string{"--help"}, 0},
		{[]string{}, 2},
		{[]string{"cuont"}, 2},
		{[]string{"completion", "bash"}, 0},
		{[]string{"completion", "tcsh"}, 2},
	} {
		if got := p.Run(c.args); got != c.want {
			t.Errorf("toy %v: exit %d, want %d", c.args, got, c.want)
		}
	}
	if Name() != "toy" {
		t.Errorf("the running program is %q, want toy", Name())
	}
}
