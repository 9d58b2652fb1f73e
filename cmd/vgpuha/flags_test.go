package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestSizeFlag(t *testing.T) {
	for _, c := range []struct {
		in   string
		want uint64
		err  string
	}{
		{"4096", 4096, ""},
		{"4GiB", 4 << 30, ""},
		{"256 MiB", 256 << 20, ""},
		{"1TiB", 1 << 40, ""},
		{"0x1000", 4096, ""},
		{"-5", 0, "out of range"},
		{"0", 0, "out of range"},
		{"4GB", 0, "not a size"},
		{"lots", 0, "not a size"},
		{"99999999999TiB", 0, "out of range"},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		var n uint64
		sizeVar(fs, &n, "size", 1, 1, maxUint64, "")
		err := fs.Set("size", c.in)
		switch {
		case c.err == "" && (err != nil || n != c.want):
			t.Errorf("%q: %d, %v; want %d", c.in, n, err, c.want)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%q: %v; want an error with %q", c.in, err, c.err)
		}
	}
	if got := formatBytes(4 << 30); got != "4GiB" {
		t.Errorf("formatBytes(4 GiB) = %q", got)
	}
}

func TestIntAndDurationFlags(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	rounds := intFlag(fs, "rounds", 7, 1, 1000, "")
	var lag int64
	sizeVar(fs, &lag, "lag", 1<<20, 1<<20, maxInt64, "")
	wait := durationFlag(fs, "wait", time.Second, 0, time.Hour, "")
	for _, bad := range [][2]string{{"rounds", "0"}, {"rounds", "-3"}, {"rounds", "1001"}, {"rounds", "2.5"},
		{"lag", "-1"}, {"lag", "9223372036854775808"}, {"wait", "-1s"}, {"wait", "2h"}, {"wait", "soon"}} {
		if err := fs.Set(bad[0], bad[1]); err == nil {
			t.Errorf("--%s %s accepted", bad[0], bad[1])
		}
	}
	if *rounds != 7 || lag != 1<<20 || *wait != time.Second {
		t.Errorf("a refused value changed the flag: %d %d %v", *rounds, lag, *wait)
	}
	if err := fs.Set("lag", "64MiB"); err != nil || lag != 64<<20 {
		t.Errorf("--lag 64MiB: %d, %v", lag, err)
	}
}

// TestParseFlagsOneLine: an unknown flag is one line naming the closest
// flag; a refused value names the flag with two dashes; both are usage
// errors (exit 2).
func TestParseFlagsOneLine(t *testing.T) {
	fs := newFlags("primary", "")
	fs.String("guest-listen", "", "")
	fs.String("replicate.key-file", "", "")
	intFlag(fs, "replicate.min-in-sync", 1, 1, 64, "")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--gust-listen", "x"}, "unknown flag --gust-listen (did you mean --guest-listen?)"},
		{[]string{"--key-file", "x"}, "did you mean --replicate.key-file?"},
		{[]string{"--zzzzzzzzzz"}, "unknown flag --zzzzzzzzzz;"},
		{[]string{"--replicate.min-in-sync", "0"}, `invalid value "0" for flag --replicate.min-in-sync: out of range`},
		{[]string{"--guest-listen"}, "flag needs an argument: --guest-listen"},
	} {
		err := parseFlags(fs, c.args)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") || !errors.As(err, new(usageError)) {
			t.Errorf("%v: %v; want one usage line with %q", c.args, err, c.want)
		}
	}
}

// TestEveryNumericFlagIsRanged: no command takes a number through the
// flag package's own numeric flags, which check neither range nor sign
// and take no size units.
func TestEveryNumericFlagIsRanged(t *testing.T) {
	unranged := map[string]bool{"*flag.intValue": true, "*flag.int64Value": true, "*flag.uintValue": true,
		"*flag.uint64Value": true, "*flag.float64Value": true, "*flag.durationValue": true}
	for _, c := range completionTable() {
		var sets []*flag.FlagSet
		capturedFlags, helpWanted = &sets, true
		run := commands[c.name].run
		args := []string{"--help"}
		if parent, name, ok := strings.Cut(c.name, " "); ok {
			run, args = commands[parent].run, []string{name, "--help"}
		}
		run(args)
		capturedFlags, helpWanted = nil, false
		for _, fs := range sets {
			fs.VisitAll(func(f *flag.Flag) {
				if typ := fmt.Sprintf("%T", f.Value); unranged[typ] {
					t.Errorf("vgpuha %s --%s is a %s: register it with intVar, sizeVar, durationVar or fractionVar", c.name, f.Name, typ)
				}
			})
		}
	}
}

// TestBadValuesRefused: each bad value is refused before anything starts,
// with exit status 2 and one line naming the flag, the variable or the
// config file's key.
func TestBadValuesRefused(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	conf := dir + "/node.toml"
	if err := os.WriteFile(conf, []byte("[guest]\nmax-sessions = -1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		env  string
		want string
	}{
		{[]string{"guest", "--size", "-5"}, "", "--size: out of range"},
		{[]string{"bench", "pv", "--rounds", "0"}, "", "--rounds: out of range"},
		{[]string{"bench", "pv", "--rounds", "-3"}, "", "--rounds: out of range"},
		{[]string{"primary", "--guest.memory-quota-bytes", "4GB"}, "", "--guest.memory-quota-bytes: \"4GB\" is not a size"},
		{[]string{"primary", "--gust-listen", "unix:///x"}, "", "did you mean --guest-listen?"},
		{[]string{"primary"}, "VGPUHA_MODE=bogus", "VGPUHA_MODE=\"bogus\" (from the environment, for --mode)"},
		{[]string{"primary", "--config", conf}, "", "guest.max-sessions in the config file " + conf},
		{[]string{"standby", "--listen", "127.0.0.1:7071"}, "", "--listen: want tcp://HOST:PORT"},
		{[]string{"primary", "--replicate.max-lag-bytes", "-1"}, "", "--replicate.max-lag-bytes: out of range"},
		{[]string{"primary", "--guest.max-grace", "-1s"}, "", "--guest.max-grace: out of range"},
		{[]string{"primary", "--tenant.quota", "uid:1=4GiB,0,1"}, "", "--tenant.quota: SESSIONS 0"},
		{[]string{"bench", "resync", "--sizes", "1GiB,4GB"}, "", "--sizes: \"4GB\" is not a size"},
		{[]string{"guest", "--workload", "vaddd"}, "", "--workload: unknown workload"},
		{[]string{"bench", "pvv"}, "", "did you mean pv?"},
	} {
		cmd := exec.Command(binFor(c.args[0]), c.args...)
		if c.env != "" {
			cmd.Env = append(os.Environ(), c.env)
		}
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), c.want) || strings.Count(string(out), "\n") != 1 {
			t.Errorf("%s vgpuha %v: %v\n%s\nwant exit 2 and one line with %q", c.env, c.args, err, out, c.want)
		}
	}
	out, err := exec.Command(vgpuhaBin, "primary", "--guest.memory-quota-bytes", "4GiB", "--tenant.memory-quota-bytes", "6 GiB", "--config.show").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "4GiB") || !strings.Contains(string(out), "6GiB") {
		t.Errorf("sizes with units: %v\n%s", err, out)
	}
}
