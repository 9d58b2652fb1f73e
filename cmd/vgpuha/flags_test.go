package main

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

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
		{[]string{"primary", "--guest.workers", "maybe"}, "", "--guest.workers: want auto, on or off"},
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
