package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// refusedAtStart runs vgpuha with args and checks that it exits 2 with
// one line on stderr holding every one of want (a node that starts
// instead is stopped after a minute, and fails the test).
func refusedAtStart(t *testing.T, args []string, want ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, vgpuhaBin, args...).CombinedOutput()
	var exit *exec.ExitError
	ok := errors.As(err, &exit) && exit.ExitCode() == 2 && strings.Count(string(out), "\n") == 1
	for _, w := range want {
		ok = ok && strings.Contains(string(out), w)
	}
	if !ok {
		t.Errorf("vgpuha %v: %v\n%s\nwant exit 2 and one line with %q", args, err, out, want)
	}
}

// TestStartupConfigurationRefused: every configuration a node cannot
// start with is refused before anything starts, exit 2, one line naming
// the flag.
func TestStartupConfigurationRefused(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	key := writeKey(t, dir)
	write := func(name, content string, mode os.FileMode) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		return path
	}
	short := write("short", "abcde\n", 0o600)
	open := write("open-key", "test-replication-key-0123456789\n", 0o644)
	state := filepath.Join(dir, "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	write("state/primary.json", "{\"term\": 1, \"serv", 0o600)
	listen := "tcp://" + freePort(t)
	standby := func(args ...string) []string {
		return append([]string{"standby", "--backend", "sim", "--listen", listen}, args...)
	}
	primary := []string{"primary", "--backend", "sim", "--guest-listen", "unix://" + filepath.Join(dir, "g.sock"),
		"--replicate-to", "tcp://" + freePort(t), "--replicate.key-file", key}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{standby("--replicate.key-file", "nosuch"), []string{"--replicate.key-file nosuch", "no such file"}},
		{standby("--replicate.key-file", short), []string{"--replicate.key-file", "5 bytes"}},
		{standby("--replicate.key-file", dir), []string{"--replicate.key-file " + dir + " is a directory"}},
		{standby("--replicate.key-file", open), []string{"--replicate.key-file " + open, "chmod 600 " + open}},
		{append(primary, "--state-dir", state), []string{"--state-dir", "primary.json", "corrupt"}},
		{append(primary, "--sim.memory-bytes", "100TiB"), []string{"--sim.memory-bytes", "out of range", "1TiB"}},
		{standby("--replicate.key-file", key, "--replicate-to", listen), []string{"--replicate-to " + listen, "own --listen"}},
		{standby("--replicate.key-file", key, "--replicate-to", strings.Replace(listen, "127.0.0.1", "localhost", 1)), []string{"own --listen"}},
	} {
		refusedAtStart(t, c.args, c.want...)
	}
}

// TestTwoStandbysOneGuestSocket: a second node given a unix guest socket
// path another node on the host has (the first standby serves there only
// once promoted) refuses to start, leaving the path to the first.
func TestTwoStandbysOneGuestSocket(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	key := writeKey(t, dir)
	sock := "unix://" + filepath.Join(dir, "g.sock")
	admin := freePort(t)
	startNode(t, "standby", "--backend", "sim", "--listen", "tcp://"+freePort(t), "--replicate.key-file", key,
		"--guest-listen", sock, "--admin-listen", admin)
	waitStatus(t, admin, "a standby", isRole("standby"))
	refusedAtStart(t, []string{"standby", "--backend", "sim", "--listen", "tcp://" + freePort(t), "--replicate.key-file", key,
		"--guest-listen", sock}, "--guest-listen "+sock, "another vgpuha node")
	refusedAtStart(t, []string{"primary", "--backend", "sim", "--guest-listen", sock}, "--guest-listen "+sock, "another vgpuha node")
}
