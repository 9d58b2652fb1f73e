package main

import (
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestTakenAddressStopsTheNode: a node whose listen address (any of them,
// whatever its role) is taken exits non-zero at start, naming the flag
// and the address, before it opens its GPU.
func TestTakenAddressStopsTheNode(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	key := writeKey(t, dir)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	addr := taken.Addr().String()
	sock := "unix://" + filepath.Join(dir, "g.sock")
	for _, c := range []struct {
		flag string
		args []string
	}{
		{"--guest-listen", []string{"primary", "--guest-listen", "tcp://" + addr}},
		{"--admin-listen", []string{"primary", "--guest-listen", sock, "--admin-listen", addr}},
		{"--listen", []string{"standby", "--listen", "tcp://" + addr, "--replicate.key-file", key}},
		{"--guest-listen", []string{"standby", "--listen", "tcp://" + freePort(t), "--replicate.key-file", key, "--guest-listen", "tcp://" + addr}},
		{"--admin-listen", []string{"standby", "--listen", "tcp://" + freePort(t), "--replicate.key-file", key, "--admin-listen", addr}},
	} {
		start := time.Now()
		out, err := exec.Command(vgpuhaBin, append(c.args, "--backend", "sim")...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.flag+" ") || !strings.Contains(string(out), addr) || !strings.Contains(string(out), "cannot listen") {
			t.Errorf("vgpuha %v with %s taken: %v\n%s\nwant a failure naming %s and the address", c.args, addr, err, out, c.flag)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("vgpuha %v took %v to refuse", c.args, d)
		}
	}
}

// waitHealthz waits until /healthz answers code with want in its body.
func waitHealthz(t *testing.T, admin string, code int, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, body := 0, ""
		if resp, err := http.Get("http://" + admin + "/healthz"); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			got, body = resp.StatusCode, string(b)
		}
		if got == code && strings.Contains(body, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz of %s: %d %q; want %d with %q", admin, got, body, code, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestHealthzSaysWhenTheNodeCannotDoItsJob: a standby with no primary
// connected, and a promoted standby whose guest endpoint was taken after
// it started, answer 503 with the reason; each answers 200 once it does
// its job again.
func TestHealthzSaysWhenTheNodeCannotDoItsJob(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	key := writeKey(t, dir)
	replAddr, adminS, adminP := freePort(t), freePort(t), freePort(t)
	standbyGuests := freePort(t)
	startNode(t, "standby", "--listen", "tcp://"+replAddr, "--replicate.key-file", key, "--backend", "sim",
		"--guest-listen", "tcp://"+standbyGuests, "--admin-listen", adminS)
	waitHealthz(t, adminS, http.StatusServiceUnavailable, "no primary's stream is connected")

	// Taken after the standby started (at start it would refuse to run).
	squatter, err := net.Listen("tcp", standbyGuests)
	if err != nil {
		t.Fatal(err)
	}
	defer squatter.Close()
	p := startPrimary(t, "--guest-listen", "unix://"+filepath.Join(dir, "p.sock"), "--replicate-to", "tcp://"+replAddr,
		"--replicate.key-file", key, "--backend", "sim", "--admin-listen", adminP)
	waitStatus(t, adminP, "protected", nodeStatus.protected)
	waitHealthz(t, adminS, http.StatusOK, "ok")

	p.cmd.Process.Signal(syscall.SIGKILL)
	p.cmd.Wait()
	waitHealthz(t, adminS, http.StatusServiceUnavailable, "not serving guests: cannot listen on tcp://"+standbyGuests+" (--guest-listen)")
	squatter.Close()
	waitHealthz(t, adminS, http.StatusOK, "ok")
	waitStatus(t, adminS, "promoted and serving", nodeStatus.promoted)
}

// TestGuestAtAWrongPortIsToldAtOnce: a guest pointed at an admin port or
// a replication port fails at once saying what it reached.
func TestGuestAtAWrongPortIsToldAtOnce(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	key := writeKey(t, dir)
	admin, repl := freePort(t), freePort(t)
	startNode(t, "standby", "--listen", "tcp://"+repl, "--replicate.key-file", key, "--backend", "sim", "--admin-listen", admin)
	waitHealthz(t, admin, http.StatusServiceUnavailable, "standby")
	for endpoint, want := range map[string]string{
		"tcp://" + admin: "admin endpoint (--admin-listen), not a guest endpoint",
		"tcp://" + repl:  "opens no vgpuha frame",
	} {
		start := time.Now()
		out, err := exec.Command(labBin, "guest", "--endpoint", endpoint, "--workload", "vadd").CombinedOutput()
		if err == nil || !strings.Contains(string(out), want) {
			t.Errorf("guest at %s: %v\n%s\nwant %q", endpoint, err, out, want)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("guest at %s took %v to fail", endpoint, d)
		}
	}
}
