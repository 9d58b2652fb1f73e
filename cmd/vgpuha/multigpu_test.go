package main

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// gpusStatus is what the multi-GPU test reads of a node's /status.
type gpusStatus struct {
	GPUs []struct {
		Index         int    `json:"index"`
		UUID          string `json:"uuid"`
		Sessions      int    `json:"sessions"`
		PromisedBytes uint64 `json:"promised_bytes"`
		Spares        int    `json:"spares"`
		SparesKept    int    `json:"spares_kept"`
	} `json:"gpus"`
	Sessions []struct {
		GPU      int  `json:"gpu"`
		Detached bool `json:"detached"`
	} `json:"sessions"`
}

func readGPUs(t *testing.T, admin string) gpusStatus {
	t.Helper()
	var st gpusStatus
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

// sessionGPUs lists the GPU of each session, sorted, and how many are
// attached.
func (st gpusStatus) sessionGPUs() (gpus []int, attached int) {
	for _, s := range st.Sessions {
		gpus = append(gpus, s.GPU)
		if !s.Detached {
			attached++
		}
	}
	slices.Sort(gpus)
	return gpus, attached
}

// roundGuest starts a guest process that runs vadd on a session it holds,
// resumable on failover, running it again on each SIGUSR1.
func roundGuest(t *testing.T, endpoint, failover string) (*exec.Cmd, *syncBuffer) {
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
	return g, stderr
}

// TestTwoGPUsReplicated: a primary and a standby of two software GPUs
// each; two guests land on the primary's two GPUs, each replica on a GPU
// the standby chose, verify finds them identical, and after a SIGKILL of
// the primary both guests carry on, on the standby's GPUs.
func TestTwoGPUsReplicated(t *testing.T) {
	skipShort(t)
	twoGPUsReplicated(t)
}

// TestTwoGPUsReplicatedWorkers is TestTwoGPUsReplicated with every
// session in a GPU worker that opens the GPU it was placed on.
func TestTwoGPUsReplicatedWorkers(t *testing.T) {
	skipShort(t)
	twoGPUsReplicated(t, "--guest.workers", "on")
}

func twoGPUsReplicated(t *testing.T, extra ...string) {
	dir := t.TempDir()
	keyFile := writeKey(t, dir)
	tokenFile := filepath.Join(dir, "admin-token")
	os.WriteFile(tokenFile, []byte("test-admin-token-0123456789\n"), 0o600)
	replB, adminA, adminB := freePort(t), freePort(t), freePort(t)
	sockA, sockB := filepath.Join(dir, "a.sock"), filepath.Join(dir, "b.sock")
	gpus := append([]string{"--backend", "sim", "--sim.gpus", "2", "--sim.memory-bytes", "1GiB", "--guest.memory-quota-bytes", "256MiB", "--guest.placement", "fewest-guests"}, extra...)
	startNode(t, append([]string{"standby", "--listen", "tcp://" + replB, "--replicate.key-file", keyFile, "--guest-listen", "unix://" + sockB,
		"--admin-listen", adminB}, gpus...)...)
	a := startPrimary(t, append([]string{"--guest-listen", "unix://" + sockA, "--replicate-to", "tcp://" + replB, "--replicate.key-file", keyFile,
		"--admin-listen", adminA, "--admin.token-file", tokenFile, "--mode", "commit"}, gpus...)...)
	waitStatus(t, adminA, "protected", nodeStatus.protected)

	g1, log1 := roundGuest(t, "unix://"+sockA, "unix://"+sockB)
	g2, log2 := roundGuest(t, "unix://"+sockA, "unix://"+sockB)
	st := readGPUs(t, adminA)
	if got, _ := st.sessionGPUs(); !slices.Equal(got, []int{0, 1}) || len(st.GPUs) != 2 || st.GPUs[0].Sessions != 1 || st.GPUs[1].Sessions != 1 ||
		st.GPUs[1].PromisedBytes != 256<<20 {
		t.Fatalf("two guests on a primary of two GPUs placed by fewest-guests: %+v", st)
	}
	spares := "0/0" // the software GPU in the node's process makes no contexts ahead
	if slices.Contains(extra, "--guest.workers") {
		spares = `\d/2` // two workers ahead per GPU (--cuda.spare-contexts), ready once they opened it
		if st.GPUs[0].SparesKept != 2 || st.GPUs[0].Spares > 2 {
			t.Errorf("GPU 0's spare workers in /status: %d of %d, want at most 2 of 2", st.GPUs[0].Spares, st.GPUs[0].SparesKept)
		}
	}
	out, err := exec.Command(vgpuhaBin, "status", "--admin", adminA, "--admin.token-file", tokenFile).CombinedOutput()
	if err != nil || !regexp.MustCompile(`(?m)^1 +GPU-76677075-6861-2d73-696d-000000000001 +vgpuha software GPU +1 +256\.0 MiB +\S+ +\S+ +1\.0 GiB +`+spares+` +\d+$`).Match(out) {
		t.Errorf("vgpuha status lists the GPUs: %v\n%s", err, out)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		got, _ := readGPUs(t, adminB).sessionGPUs()
		if slices.Equal(got, []int{0, 1}) {
			break // the standby's own fewest-guests put the two replicas on its two GPUs
		}
		if time.Now().After(deadline) {
			t.Fatalf("the standby's replicas: %+v", readGPUs(t, adminB))
		}
	}
	out, err = exec.Command(vgpuhaBin, "verify", "--admin", adminA, "--admin.token-file", tokenFile, "--json").Output()
	var rep struct{ Match bool }
	if err != nil || json.Unmarshal(out, &rep) != nil || !rep.Match {
		t.Fatalf("verify of the two GPUs' sessions: %v\n%s", err, out)
	}

	a.cmd.Process.Kill()
	a.cmd.Wait()
	waitStatus(t, adminB, "promoted", nodeStatus.promoted)
	for _, g := range []*exec.Cmd{g1, g2} {
		g.Process.Signal(syscall.SIGUSR1)
	}
	for i, log := range []*syncBuffer{log1, log2} {
		for deadline := time.Now().Add(20 * time.Second); !strings.Contains(log.String(), "round 2 verified"); time.Sleep(20 * time.Millisecond) {
			if strings.Contains(log.String(), "round 2 failed") || time.Now().After(deadline) {
				t.Fatalf("guest %d after the primary's SIGKILL: %s", i+1, log.String())
			}
		}
	}
	if got, attached := readGPUs(t, adminB).sessionGPUs(); !slices.Equal(got, []int{0, 1}) || attached != 2 {
		t.Fatalf("after the failover the new primary serves sessions on GPUs %v, %d attached; want both GPUs, both attached", got, attached)
	}
}
