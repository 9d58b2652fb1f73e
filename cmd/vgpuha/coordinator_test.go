package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/internal/coordinator"
	"github.com/vgpuha/vgpuha/internal/lab/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestCoordinatedProcesses: a primary and a standby process share an
// (embedded) etcd. The primary freezes for longer than its 2 s lease: the
// standby takes over only once it won the election; the thawed primary
// finds itself fenced and serves nobody; `vgpuha status --coordinator`
// shows the group.
func TestCoordinatedProcesses(t *testing.T) {
	skipShort(t)
	etcd := "etcd://" + etcdtest.Start(t)
	dir := t.TempDir()
	keyFile := writeKey(t, dir)
	replAddr, adminAddr, standbyAdmin := freePort(t), freePort(t), freePort(t)
	sock, standbySock := filepath.Join(dir, "g.sock"), filepath.Join(dir, "s.sock")
	co := []string{"--coordinator", etcd, "--coordinator.group", "vm7", "--coordinator.ttl", "2s"} // 2 s: a race-enabled suite on 2 cores starves 1 s leases
	startNode(t, append([]string{"standby", "--listen", "tcp://" + replAddr, "--replicate.key-file", keyFile,
		"--guest-listen", "unix://" + standbySock, "--admin-listen", standbyAdmin, "--coordinator.id", "s"}, co...)...)
	p := startPrimary(t, append([]string{"--guest-listen", "unix://" + sock, "--admin-listen", adminAddr,
		"--replicate-to", "tcp://" + replAddr, "--replicate.key-file", keyFile, "--coordinator.id", "p"}, co...)...)
	waitStatus(t, adminAddr, "protected", nodeStatus.protected)
	waitInSyncRecorded(t, etcd) // else the standby may not campaign: a frozen primary is never replaced
	frozen := time.Now()
	p.cmd.Process.Signal(syscall.SIGSTOP)
	waitStatus(t, standbyAdmin, "promoted", nodeStatus.promoted)
	t.Logf("primary frozen at 0; the standby serves after %v (lease 2 s)", time.Since(frozen).Round(time.Millisecond))
	p.cmd.Process.Signal(syscall.SIGCONT)
	// As its server enforces it (the role changes a moment before).
	waitStatus(t, adminAddr, "fenced and serving no guest", func(s nodeStatus) bool { return s.Role == "fenced" && !s.Serving })
	if _, err := runGuestProc("unix://"+sock, "vadd", 0); err == nil {
		t.Fatal("a fenced primary served a guest")
	}
	if _, err := runGuestProc("unix://"+standbySock, "vadd", 0); err != nil {
		t.Fatalf("the promoted standby does not serve guests: %v", err)
	}
	out, err := exec.Command(vgpuhaBin, "status", "--coordinator", etcd).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "vm7") || !strings.Contains(string(out), "leader") {
		t.Fatalf("status: %v\n%s", err, out)
	}
	t.Logf("vgpuha status --coordinator:\n%s", out)
	if !strings.Contains(p.stderr.String(), "fenced") {
		t.Errorf("the old primary's log does not say it was fenced:\n%s", p.stderr.String())
	}
}

// waitInSyncRecorded waits until the group's record in etcd (at
// etcd://HOST:PORT) names a standby in sync: the leader writes it some
// time after it is protected (a fixed 300 ms wait was overrun on a loaded
// machine, and an unrecorded standby never takes over).
func waitInSyncRecorded(t *testing.T, etcd string) {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{strings.TrimPrefix(etcd, "etcd://")}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		gs, err := coordinator.Groups(ctx, cli)
		cancel()
		if err == nil && len(gs) == 1 && len(gs[0].Standby.InSyncAddrs()) > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd never recorded a standby in sync (groups %+v, err %v)", gs, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
