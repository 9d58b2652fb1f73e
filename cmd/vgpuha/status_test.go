package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/internal/node"
)

// resyncing is a standby halfway through a 3 GiB resync at 100 MiB/s.
var resyncing = node.Status{Role: "standby", Term: 4, Replication: node.Replication{Direction: node.FromPrimary,
	Peer: "10.0.0.1:40000", State: "resyncing", Connected: true,
	Resync: &node.Resync{BytesDone: 3 << 29, BytesTotal: 3 << 30, RateBytesPerSecond: 100 << 20, ETASeconds: 15.36}}}

// TestStatusRendering: a resync is a bar on a terminal and one plain line
// (no \r, no escape sequences) otherwise; a watch's line is logfmt.
func TestStatusRendering(t *testing.T) {
	cases := []struct {
		tty  bool
		want []string
	}{
		{true, []string{"resync [###############...............]  50%  1.5 GiB / 3.0 GiB  100.0 MiB/s  ETA 15s\n"}},
		{false, []string{"resync bytes_done=1610612736 bytes_total=3221225472 rate_bytes_per_second=104857600 eta_seconds=15.4\n"}},
	}
	for _, c := range cases {
		var out bytes.Buffer
		if err := printStatusTable(&out, "n1", resyncing, c.tty); err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`(?m)^n1 +standby +4 +false +0 +from_primary +resyncing +10\.0\.0\.1:40000 +0 +0 +0\.000 +- *$`).Match(out.Bytes()) {
			t.Errorf("tty=%v: no status row:\n%s", c.tty, out.String())
		}
		for _, w := range c.want {
			if !strings.HasSuffix(out.String(), w) {
				t.Errorf("tty=%v: output does not end with %q:\n%s", c.tty, w, out.String())
			}
		}
		if strings.ContainsAny(out.String(), "\r\033") {
			t.Errorf("tty=%v: carriage return or escape in %q", c.tty, out.String())
		}
	}
	line := statusLine(time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC), "n1", resyncing)
	want := "2025-01-02T03:04:05.000Z node=n1 role=standby term=4 serving=false sessions=0 replication=from_primary state=resyncing " +
		"lag_records=0 lag_bytes=0 lag_seconds=0.000 resync_bytes_done=1610612736 resync_bytes_total=3221225472 " +
		"resync_rate_bytes_per_second=104857600 resync_eta_seconds=15.4"
	if line != want {
		t.Errorf("watch line:\n got %s\nwant %s", line, want)
	}
	for _, c := range []struct {
		done, total uint64
		bar         string
	}{{0, 0, "[....]   0%"}, {0, 10, "[....]   0%"}, {10, 10, "[####] 100%"}, {20, 10, "[####] 100%"}, {3, 4, "[###.]  75%"}} {
		if got := resyncBar(node.Resync{BytesDone: c.done, BytesTotal: c.total}, 4); !strings.HasPrefix(got, "resync "+c.bar) {
			t.Errorf("bar for %d/%d: %q, want %q", c.done, c.total, got, c.bar)
		}
	}
	for n, want := range map[float64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1.5 * (1 << 30): "1.5 GiB", 1 << 50: "1024.0 TiB"} {
		if got := humanBytes(n); got != want {
			t.Errorf("humanBytes(%v) = %q, want %q", n, got, want)
		}
	}
	for s, want := range map[float64]string{0: "-", 0.4: "0s", 0.6: "1s", 61: "1m1s"} {
		if got := eta(s); got != want {
			t.Errorf("eta(%v) = %q, want %q", s, got, want)
		}
	}
}

// TestStatusWatchDuringResync: a standby that starts late is resynced
// (paced to 4 MB/s); `vgpuha status --admin --watch` into a pipe prints one
// plain line a poll with the resync's bytes, rate and ETA, then the
// primary protected, and stops cleanly on SIGINT.
func TestStatusWatchDuringResync(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	keyFile := writeKey(t, dir)
	replAddr, adminP, adminS := freePort(t), freePort(t), freePort(t)
	sock := filepath.Join(dir, "g.sock")
	startPrimary(t, "--guest-listen", "unix://"+sock, "--admin-listen", adminP, "--replicate-to", "tcp://"+replAddr,
		"--replicate.key-file", keyFile, "--replicate.resync-rate", "4000000")
	h := exec.Command(labBin, "guest", "--endpoint", "unix://"+sock, "--workload", "vadd", "--size", "1000000", "--hold")
	hs := &syncBuffer{}
	h.Stderr = hs
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { h.Process.Signal(syscall.SIGTERM); h.Wait() }()
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(hs.String(), "holding the session"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("guest did not hold its session: %s", hs.String())
		}
	}
	w := exec.Command(vgpuhaBin, "status", "--admin", adminP, "--watch", "100ms")
	stdout, err := w.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Process.Kill()
	startNode(t, "standby", "--listen", "tcp://"+replAddr, "--replicate.key-file", keyFile, "--admin-listen", adminS)

	resync := regexp.MustCompile(`state=resyncing .* resync_bytes_done=(\d+) resync_bytes_total=(\d+) resync_rate_bytes_per_second=(\d+) resync_eta_seconds=`)
	var all strings.Builder
	sawResync, sawStandby := false, false
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		all.WriteString(line + "\n")
		if m := resync.FindStringSubmatch(line); m != nil && m[2] != "0" && m[3] != "0" {
			sawResync = true
			if !sawStandby {
				out, err := exec.Command(vgpuhaBin, "status", "--admin", adminS).CombinedOutput()
				sawStandby = err == nil && regexp.MustCompile(`(?m)^resync bytes_done=\d+ bytes_total=[1-9]\d* `).Match(out)
			}
		}
		if strings.Contains(line, "state=protected") {
			break
		}
	}
	w.Process.Signal(os.Interrupt)
	if err := w.Wait(); err != nil {
		t.Errorf("the watch did not stop cleanly on SIGINT: %v", err)
	}
	// The standby (a pure replica: it never takes over) in sync, holding
	// the guest's session.
	row := ` standby +1 +false +1 +from_primary +in_sync +127\.0\.0\.1:\d+ +0 +0 +0\.000 +\d+\.\d{3}\n`
	if st, err := exec.Command(vgpuhaBin, "status", "--admin", adminS).CombinedOutput(); err != nil || !regexp.MustCompile(row).Match(st) {
		t.Errorf("vgpuha status --admin on the standby: %v, want a row matching %q:\n%s", err, row, st)
	}
	out := all.String()
	if !sawResync || !sawStandby || !strings.Contains(out, "state=protected") {
		t.Errorf("watch output: resync seen %v (and on the standby %v), protected seen %v:\n%s", sawResync, sawStandby,
			strings.Contains(out, "state=protected"), out)
	}
	if strings.ContainsAny(out, "\r\033") {
		t.Errorf("carriage returns or escapes in a pipe:\n%q", out)
	}
}
