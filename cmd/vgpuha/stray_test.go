package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/internal/lab/workload"
	"github.com/vgpuha/vgpuha/pvdriver"
)

// pairStatus is what the stray-primary test reads of a node's /status.
type pairStatus struct {
	Role        string `json:"role"`
	Term        uint64 `json:"term"`
	Replication struct {
		State             string `json:"state"`
		ResyncsTotal      uint64 `json:"resyncs_total"`
		RefusedPeersTotal uint64 `json:"refused_peers_total"`
		RefusedPeers      struct {
			Fenced     uint64 `json:"fenced"`
			StaleTerm  uint64 `json:"stale_term"`
			OtherGroup uint64 `json:"other_group"`
		} `json:"refused_peers"`
		Group string `json:"group"`
	} `json:"replication"`
}

// readPair reads a node's /status.
func readPair(t *testing.T, admin string) pairStatus {
	t.Helper()
	var st pairStatus
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

// waitPair polls a node's /status until ok holds.
func waitPair(t *testing.T, admin, what string, ok func(pairStatus) bool) pairStatus {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if st := readPair(t, admin); ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: timed out waiting for %s: %+v", admin, what, readPair(t, admin))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestStrayPrimaryRefused is issue 34's reproduction with processes: a
// pair (A protecting a guest's state on standby B), and a second primary C
// started with --replicate-to B and the same key (a typo, an old unit on
// the wrong host, a restored image). B refuses C and counts it, never
// resyncs for it, and C's heartbeats do not keep B from taking over: the
// pair stays protected, verify matches, and a SIGKILL of A promotes B with
// every byte the guest had (its workloads' checksums unchanged), after
// which C, told B's term, stops serving.
func TestStrayPrimaryRefused(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	keyFile := writeKey(t, dir)
	tokenFile := filepath.Join(dir, "admin-token")
	os.WriteFile(tokenFile, []byte("test-admin-token-0123456789\n"), 0o600)
	replB, adminA, adminB, adminC := freePort(t), freePort(t), freePort(t), freePort(t)
	sockA, sockB, sockC := filepath.Join(dir, "a.sock"), filepath.Join(dir, "b.sock"), filepath.Join(dir, "c.sock")
	startNode(t, "standby", "--listen", "tcp://"+replB, "--replicate.key-file", keyFile, "--guest-listen", "unix://"+sockB, "--admin-listen", adminB)
	a := startPrimary(t, "--guest-listen", "unix://"+sockA, "--replicate-to", "tcp://"+replB, "--replicate.key-file", keyFile,
		"--admin-listen", adminA, "--admin.token-file", tokenFile)
	waitStatus(t, adminA, "protected", nodeStatus.protected)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	g, err := pvdriver.Open(ctx, "unix://"+sockA, pvdriver.Options{GuestName: "g", Failover: []string{"unix://" + sockB}})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	ws, _ := workload.Select("all")
	want := map[string]string{}
	runRound := func(round string) {
		t.Helper()
		for _, w := range ws {
			r, err := w.Run(context.Background(), g, 0)
			if err != nil {
				t.Fatalf("%s: %v", round, err)
			}
			if prev, ok := want[r.Name]; !r.Verified || ok && prev != r.Checksum {
				t.Fatalf("%s %s: verified %v, checksum %s, before %s", round, r.Name, r.Verified, r.Checksum, prev)
			}
			want[r.Name] = r.Checksum
		}
	}
	runRound("before the stray")

	startPrimary(t, "--guest-listen", "unix://"+sockC, "--replicate-to", "tcp://"+replB, "--replicate.key-file", keyFile, "--admin-listen", adminC)
	waitPair(t, adminB, "the stray refused three times", func(s pairStatus) bool { return s.Replication.RefusedPeers.OtherGroup >= 3 })
	if st := waitPair(t, adminC, "the refusals counted by the stray", func(s pairStatus) bool { return s.Replication.RefusedPeersTotal >= 2 }); st.Replication.State != "unprotected" {
		t.Errorf("the stray is %s", st.Replication.State)
	}
	runRound("with the stray refused")
	stA := readPair(t, adminA)
	if stA.Replication.State != "protected" || stA.Replication.ResyncsTotal != 1 {
		t.Fatalf("the real primary: %s after %d resyncs, want protected after 1", stA.Replication.State, stA.Replication.ResyncsTotal)
	}
	if stB := readPair(t, adminB); stB.Replication.Group != stA.Replication.Group || stB.Replication.Group == "" {
		t.Errorf("the standby follows group %q, the primary's is %q", stB.Replication.Group, stA.Replication.Group)
	}
	out, err := exec.Command(vgpuhaBin, "verify", "--admin", adminA, "--admin.token-file", tokenFile, "--json").Output()
	var rep struct{ Match bool }
	if err != nil || json.Unmarshal(out, &rep) != nil || !rep.Match {
		t.Fatalf("verify: %v %s", err, out)
	}

	a.cmd.Process.Kill()
	waitStatus(t, adminB, "promoted", nodeStatus.promoted)
	runRound("on the promoted standby")
	if fo := g.Failovers(); len(fo) != 1 || fo[0].Term != 2 {
		t.Fatalf("failovers: %+v", fo)
	}
	waitPair(t, adminC, "the stray fenced by the promoted standby's term", func(s pairStatus) bool { return s.Role == "fenced" })
}

// TestOldPrimaryCommandLineRefused is the second story with
// processes, with a named group: a pair fails over (A killed, B promoted
// under term 2), fails back by switchover (A' promoted under term 3, B
// restarted as its standby), and then A's original command line is started
// again. B refuses it (stale_term, counted), tells it term 3 so that it
// fences itself, and never resyncs for it; the pair stays protected, verify
// matches, and a SIGKILL of A' promotes B with every byte.
func TestOldPrimaryCommandLineRefused(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	keyFile := writeKey(t, dir)
	tokenFile := filepath.Join(dir, "admin-token")
	os.WriteFile(tokenFile, []byte("test-admin-token-0123456789\n"), 0o600)
	replA, replB, adminA, adminB, adminC := freePort(t), freePort(t), freePort(t), freePort(t), freePort(t)
	sockA, sockB, sockC := filepath.Join(dir, "a.sock"), filepath.Join(dir, "b.sock"), filepath.Join(dir, "c.sock")
	common := []string{"--group", "vm7", "--replicate.key-file", keyFile, "--admin.token-file", tokenFile}
	standbyB := append([]string{"standby", "--listen", "tcp://" + replB, "--guest-listen", "unix://" + sockB, "--admin-listen", adminB,
		"--replicate-to", "tcp://" + replA}, common...)
	primaryA := append([]string{"--guest-listen", "unix://" + sockA, "--replicate-to", "tcp://" + replB, "--admin-listen", adminA}, common...)
	b := startNode(t, standbyB...)
	a := startPrimary(t, primaryA...)
	waitStatus(t, adminA, "protected", nodeStatus.protected)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	g, err := pvdriver.Open(ctx, "unix://"+sockA, pvdriver.Options{GuestName: "g", Failover: []string{"unix://" + sockB, "unix://" + sockA}})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	ws, _ := workload.Select("all")
	want := map[string]string{}
	runRound := func(round string) {
		t.Helper()
		for _, w := range ws {
			r, err := w.Run(context.Background(), g, 0)
			if err != nil {
				t.Fatalf("%s: %v", round, err)
			}
			if prev, ok := want[r.Name]; !r.Verified || ok && prev != r.Checksum {
				t.Fatalf("%s %s: verified %v, checksum %s, before %s", round, r.Name, r.Verified, r.Checksum, prev)
			}
			want[r.Name] = r.Checksum
		}
	}
	runRound("on A")

	// Fail over to B, fail back to A' by switchover, B back as standby.
	a.cmd.Process.Kill()
	waitStatus(t, adminB, "B promoted", nodeStatus.promoted)
	runRound("on B")
	a2 := startNode(t, append([]string{"standby", "--listen", "tcp://" + replA, "--guest-listen", "unix://" + sockA, "--admin-listen", adminA,
		"--replicate-to", "tcp://" + replB}, common...)...)
	waitStatus(t, adminB, "B protected by A'", nodeStatus.protected)
	if out, err := exec.Command(vgpuhaBin, "switchover", "--admin", adminB, "--admin.token-file", tokenFile).CombinedOutput(); err != nil {
		t.Fatalf("switchover: %v\n%s", err, out)
	}
	waitPair(t, adminA, "A' primary under term 3", func(s pairStatus) bool { return s.Role == "primary" && s.Term == 3 })
	waitStatusSays(t, adminA, "the node at "+replB+" was deposed", "restart it as this node's standby: vgpuha standby --listen tcp://"+replB)
	b.cmd.Process.Kill()
	b.cmd.Wait()
	startNode(t, standbyB...)
	stA := waitPair(t, adminA, "A' protected by B", func(s pairStatus) bool { return s.Replication.State == "protected" })
	runRound("on A'")

	// A's original command line, started again.
	startPrimary(t, append([]string{"--guest-listen", "unix://" + sockC, "--replicate-to", "tcp://" + replB, "--admin-listen", adminC}, common...)...)
	waitPair(t, adminC, "the old command line fenced by term 3", func(s pairStatus) bool { return s.Role == "fenced" && s.Term == 3 })
	waitPair(t, adminB, "the refusal counted by B", func(s pairStatus) bool { return s.Replication.RefusedPeers.StaleTerm >= 1 })
	runRound("on A' with the old primary refused")
	if st := readPair(t, adminA); st.Replication.State != "protected" || st.Replication.ResyncsTotal != stA.Replication.ResyncsTotal {
		t.Fatalf("A': %s after %d resyncs, want protected after %d", st.Replication.State, st.Replication.ResyncsTotal, stA.Replication.ResyncsTotal)
	}
	out, err := exec.Command(vgpuhaBin, "verify", "--admin", adminA, "--admin.token-file", tokenFile, "--json").Output()
	var rep struct{ Match bool }
	if err != nil || json.Unmarshal(out, &rep) != nil || !rep.Match {
		t.Fatalf("verify: %v %s", err, out)
	}
	a2.cmd.Process.Kill()
	waitStatus(t, adminB, "B promoted again", nodeStatus.promoted)
	runRound("on B, promoted again")
	if fo := g.Failovers(); len(fo) != 3 || fo[2].Term != 4 {
		t.Fatalf("failovers: %+v", fo)
	}
}
