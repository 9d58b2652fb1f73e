package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

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
