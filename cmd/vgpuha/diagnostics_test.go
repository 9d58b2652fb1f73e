package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
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

// TestStatusAsDocumented: status without --admin asks 127.0.0.1:9470
// (as verify and switchover do); --watch alone polls (one line per poll
// into a pipe) until interrupted; --admin at a guest endpoint says it is
// not an admin endpoint.
func TestStatusAsDocumented(t *testing.T) {
	skipShort(t)
	out, _ := exec.Command(vgpuhaBin, "status").CombinedOutput()
	if !strings.Contains(string(out), "127.0.0.1:9470") {
		t.Errorf("vgpuha status:\n%s\nwant the status of 127.0.0.1:9470, or why it has none", out)
	}
	dir := t.TempDir()
	sock := "unix://" + filepath.Join(dir, "g.sock")
	admin := freePort(t)
	startPrimary(t, "--backend", "sim", "--guest-listen", sock, "--admin-listen", admin)

	w := exec.Command(vgpuhaBin, "status", "--admin", admin, "--watch")
	lines := &syncBuffer{}
	w.Stdout, w.Stderr = lines, lines
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for strings.Count(lines.String(), "role=primary") < 2 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	w.Process.Signal(os.Interrupt)
	if err := w.Wait(); err != nil || strings.Count(lines.String(), "role=primary") < 2 {
		t.Errorf("vgpuha status --admin %s --watch: %v\n%s\nwant a line per poll and exit 0 on SIGINT", admin, err, lines)
	}

	out, err := exec.Command(vgpuhaBin, "status", "--admin", sock).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "not a vgpuha admin endpoint") || strings.Contains(string(out), "malformed") {
		t.Errorf("vgpuha status --admin %s (a guest endpoint): %v\n%s", sock, err, out)
	}
}

// waitStatusSays waits until `vgpuha status --admin admin` prints every
// one of want.
func waitStatusSays(t *testing.T, admin string, want ...string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, _ := exec.Command(vgpuhaBin, "status", "--admin", admin).CombinedOutput()
		missing := ""
		for _, w := range want {
			if !strings.Contains(string(out), w) {
				missing = w
			}
		}
		if missing == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("vgpuha status --admin %s never said %q:\n%s", admin, missing, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestStandbySaysItsKeyDiffers: a primary holding another key is named,
// with the fix, in the standby's status, /healthz and log (the standby
// alone used to say only "disconnected").
func TestStandbySaysItsKeyDiffers(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	key := writeKey(t, dir)
	other := filepath.Join(dir, "other-key")
	if err := os.WriteFile(other, []byte("another-replication-key-987654\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	repl, adminS := freePort(t), freePort(t)
	s := startNode(t, "standby", "--backend", "sim", "--listen", "tcp://"+repl, "--replicate.key-file", key, "--admin-listen", adminS)
	waitStatus(t, adminS, "a standby", isRole("standby"))
	startPrimary(t, "--backend", "sim", "--guest-listen", "unix://"+filepath.Join(dir, "g.sock"), "--replicate-to", "tcp://"+repl,
		"--replicate.key-file", other)
	const says = "a primary at 127.0.0.1 is connecting and being refused"
	waitStatusSays(t, adminS, says, "replication key differs", "same key file on both nodes")
	waitHealthz(t, adminS, 503, says)
	waitLog(t, s, "its replication key differs from this node's")
}

// TestSIGTERMOfAReplicatedPrimaryWarns: stopping a primary that has a
// standby warns that the standby takes over and this node comes back
// deposed, and points to switchover.
func TestSIGTERMOfAReplicatedPrimaryWarns(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	key := writeKey(t, dir)
	repl, adminP := freePort(t), freePort(t)
	startNode(t, "standby", "--backend", "sim", "--listen", "tcp://"+repl, "--replicate.key-file", key)
	p := startPrimary(t, "--backend", "sim", "--guest-listen", "unix://"+filepath.Join(dir, "g.sock"), "--replicate-to", "tcp://"+repl,
		"--replicate.key-file", key, "--admin-listen", adminP, "--state-dir", dir)
	waitStatus(t, adminP, "protected", nodeStatus.protected)
	p.cmd.Process.Signal(syscall.SIGTERM)
	p.cmd.Wait()
	log := p.stderr.String()
	if !strings.Contains(log, "level=WARN msg=\"stopping a replicated primary: its standby will take over") || !strings.Contains(log, "vgpuha switchover") {
		t.Errorf("a replicated primary's log at SIGTERM:\n%s\nwant a warning that its standby takes over, pointing to vgpuha switchover", log)
	}
}
