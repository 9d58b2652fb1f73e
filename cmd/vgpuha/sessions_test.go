package main

import (
	"encoding/json"
	"math"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// sessionsStatus is what these tests read of a node's /status sessions.
type sessionsStatus struct {
	Role     string `json:"role"`
	Serving  bool   `json:"serving"`
	Sessions []struct {
		Detached         bool    `json:"detached"`
		DetachedSeconds  float64 `json:"detached_seconds"`
		ExpiresInSeconds float64 `json:"expires_in_seconds"`
	} `json:"sessions"`
	DetachedSessions int `json:"detached_sessions"`
}

func readSessions(t *testing.T, admin string) sessionsStatus {
	t.Helper()
	var st sessionsStatus
	resp, err := http.Get("http://" + admin + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

// holdGuest starts a guest process that runs a workload, can fail over to
// failover, and holds its session until killed.
func holdGuest(t *testing.T, endpoint, failover string) *exec.Cmd {
	t.Helper()
	g := exec.Command(labBin, "guest", "--endpoint", endpoint, "--failover", failover, "--workload", "vadd", "--hold")
	stderr := &syncBuffer{}
	g.Stderr = stderr
	if err := g.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Process.Kill(); g.Wait() })
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(stderr.String(), "holding the session"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("guest did not run its workload: %s", stderr.String())
		}
	}
	return g
}

// TestDetachedSessionExpiresAfterFailover is issue 35's reproduction: both
// nodes keep a detached session at most 5 s; a held guest is killed, then
// its primary. The promoted standby adopts the session it holds as a
// replica and frees it 5 s after it began to serve, as the primary would
// have (it used to keep it for ever).
func TestDetachedSessionExpiresAfterFailover(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	keyFile := writeKey(t, dir)
	replB, adminA, adminB := freePort(t), freePort(t), freePort(t)
	sockA, sockB := filepath.Join(dir, "a.sock"), filepath.Join(dir, "b.sock")
	startNode(t, "standby", "--listen", "tcp://"+replB, "--replicate.key-file", keyFile, "--guest-listen", "unix://"+sockB,
		"--admin-listen", adminB, "--guest.max-grace", "5s")
	a := startPrimary(t, "--guest-listen", "unix://"+sockA, "--replicate-to", "tcp://"+replB, "--replicate.key-file", keyFile,
		"--admin-listen", adminA, "--guest.max-grace", "5s")
	waitStatus(t, adminA, "protected", nodeStatus.protected)

	g := holdGuest(t, "unix://"+sockA, "unix://"+sockB)
	g.Process.Kill()
	g.Wait()
	for deadline := time.Now().Add(10 * time.Second); readSessions(t, adminA).DetachedSessions != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the primary never kept the killed guest's session: %+v", readSessions(t, adminA))
		}
	}
	if st := readSessions(t, adminB); len(st.Sessions) != 1 {
		t.Fatalf("the standby has no replica of the session: %+v", st)
	}
	a.cmd.Process.Kill()
	a.cmd.Wait()
	waitStatus(t, adminB, "promoted", nodeStatus.promoted)
	promoted := time.Now()
	if st := readSessions(t, adminB); len(st.Sessions) == 1 {
		// Kept since the takeover for its whole grace, whenever this was read.
		if s := st.Sessions[0]; !s.Detached || math.Abs(s.DetachedSeconds+s.ExpiresInSeconds-5) > 0.01 {
			t.Fatalf("the promoted node did not adopt the session for its 5 s grace: %+v", s)
		}
	}
	for {
		st := readSessions(t, adminB)
		if len(st.Sessions) == 0 {
			break
		}
		if time.Since(promoted) > 15*time.Second {
			t.Fatalf("the session is still on the new primary %v after it took over: %+v", time.Since(promoted), st)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestProgramsBackToBack is issue 32's: with one session slot, 20 guest
// programs run one right after another, no gap, and all are served
// (each one's session is freed before its process exits). Half of them
// could fail over, so the node would keep their session for a resume if
// they did not end it.
func TestProgramsBackToBack(t *testing.T) {
	skipShort(t)
	sock := filepath.Join(t.TempDir(), "g.sock")
	startPrimary(t, "--guest-listen", "unix://"+sock, "--guest.max-sessions", "1")
	for i := 0; i < 20; i++ {
		args := []string{"guest", "--endpoint", "unix://" + sock, "--workload", "vadd", "--size", "4096"}
		if i%2 == 1 {
			args = append(args, "--failover", "unix://"+filepath.Join(filepath.Dir(sock), "none.sock"))
		}
		if out, err := exec.Command(labBin, args...).CombinedOutput(); err != nil {
			t.Fatalf("program %d: %v\n%s", i, err, out)
		}
	}
}
