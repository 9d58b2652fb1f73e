package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/bench"
	"github.com/vgpuha/vgpuha/internal/agent"
	"github.com/vgpuha/vgpuha/internal/lab/drill"
	"github.com/vgpuha/vgpuha/internal/lab/workload"
	"github.com/vgpuha/vgpuha/mmiotrace"
	"github.com/vgpuha/vgpuha/pvdriver"
)

// vgpuhaBin is the agent; labBin the lab tool (cmd/vgpuha-lab: the
// agent's commands and the lab's), whose guests, drills and benchmarks the tests
// run against the agent.
var vgpuhaBin, labBin string

// binFor is the binary that has command: the agent for its own, the lab
// tool for the rest.
func binFor(command string) string {
	if _, ok := agent.Commands()[command]; ok {
		return vgpuhaBin
	}
	return labBin
}

// TestMain builds the real vgpuha binaries once; the tests run them as
// separate processes talking over real sockets.
func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run()) // every test skips: no binary needed
	}
	dir, err := os.MkdirTemp("", "vgpuha-bin")
	if err != nil {
		panic(err)
	}
	vgpuhaBin, labBin = filepath.Join(dir, "vgpuha"), filepath.Join(dir, "vgpuha-lab")
	for _, build := range [][]string{{"-o", vgpuhaBin, "."}, {"-o", labBin, "../vgpuha-lab"}} {
		out, err := exec.Command("go", append([]string{"build"}, build...)...).CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "building %v: %v\n%s", build, err, out)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// skipShort skips under -short: every test here starts vgpuha processes.
func skipShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("slow: starts vgpuha processes")
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		// The kernel may hand a port it just took back out again: a test
		// that asked twice once got one port for two nodes' listeners.
		if _, given := portsGiven.LoadOrStore(addr, true); !given {
			return addr
		}
	}
	t.Fatal("no port this test binary has not handed out already")
	return ""
}

// portsGiven are the ports freePort handed out: never one twice.
var portsGiven sync.Map

type proc struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// startPrimary runs `vgpuha primary` and waits until it accepts guests.
func startPrimary(t *testing.T, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(vgpuhaBin, append([]string{"primary"}, args...)...), stderr: &syncBuffer{}}
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			p.cmd.Process.Kill()
			p.cmd.Wait()
		}
		if t.Failed() {
			t.Logf("primary log:\n%s", p.stderr.String())
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.stderr.String(), "primary serving guests") {
		if time.Now().After(deadline) {
			t.Fatalf("primary did not start:\n%s", p.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return p
}

// startNode runs `vgpuha ARGS...` and stops it when the test ends, showing
// its log if the test failed.
func startNode(t *testing.T, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(vgpuhaBin, args...), stderr: &syncBuffer{}}
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.cmd.Process.Signal(syscall.SIGCONT)
		p.cmd.Process.Kill()
		p.cmd.Wait()
		if t.Failed() {
			t.Logf("%s log:\n%s", args[0], p.stderr.String())
		}
	})
	return p
}

// nodeStatus is what the tests read of a node's /status (node.Status, the
// one shape of every role).
type nodeStatus struct {
	Role        string `json:"role"`
	Serving     bool   `json:"serving"`
	Replication struct {
		Direction string `json:"direction"`
		State     string `json:"state"`
	} `json:"replication"`
	Promotion *struct {
		Term uint64 `json:"term"`
	} `json:"promotion"`
}

// protected: a primary (first or promoted) whose standby holds everything.
func (s nodeStatus) protected() bool {
	return s.Role == "primary" && s.Replication.State == "protected"
}

// promoted: a standby that took over and serves.
func (s nodeStatus) promoted() bool {
	return s.Role == "primary" && s.Promotion != nil && s.Serving
}

// waitStatus polls a node's admin /status until ok holds: readiness from
// the node's own account, not from its log.
func waitStatus(t *testing.T, admin, what string, ok func(nodeStatus) bool) nodeStatus {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var st nodeStatus
		if resp, err := http.Get("http://" + admin + "/status"); err == nil {
			json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
			if ok(st) {
				return st
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never %s; last status %+v", admin, what, st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func isRole(role string) func(nodeStatus) bool {
	return func(s nodeStatus) bool { return s.Role == role }
}

// writeKey writes the tests' replication key into dir and returns its path.
func writeKey(t *testing.T, dir string) string {
	t.Helper()
	keyFile := filepath.Join(dir, "key")
	if err := os.WriteFile(keyFile, []byte("test-replication-key-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return keyFile
}

// waitLog waits until what appears in p's log.
func waitLog(t *testing.T, p *proc, what string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(p.stderr.String(), what) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in log:\n%s", what, p.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// guestJSON is what `vgpuha guest --json` prints (lab_guest.go).
type guestJSON struct {
	Session   uint64            `json:"session"`
	Workloads []workload.Result `json:"workloads"`
	Verified  bool              `json:"verified"`
}

func runGuestProc(endpoint, name string, size int) (guestJSON, error) {
	var rep guestJSON
	cmd := exec.Command(labBin, "guest", "--endpoint", endpoint, "--workload", name, "--json", "--size", fmt.Sprint(size))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return rep, fmt.Errorf("guest: %v: %s", err, stderr.String())
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		return rep, fmt.Errorf("guest output %q: %v", out, err)
	}
	return rep, nil
}

// TestPrimaryServesGuests runs every workload from several guest processes
// at once, over unix and tcp, while a misbehaving client sends garbage and
// another dies mid-frame; then checks the admin endpoints and a clean
// shutdown on SIGTERM.
func TestPrimaryServesGuests(t *testing.T) {
	skipShort(t)
	sock := filepath.Join(t.TempDir(), "guest.sock")
	tcpAddr, adminAddr := freePort(t), freePort(t)
	p := startPrimary(t, "--guest-listen", "unix://"+sock, "--admin-listen", adminAddr)
	p2 := startPrimary(t, "--guest-listen", "tcp://"+tcpAddr)

	endpoints := []string{"unix://" + sock, "tcp://" + tcpAddr}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for _, ep := range endpoints {
		for g := 0; g < 3; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rep, err := runGuestProc(ep, "all", 0)
				if err != nil {
					errs <- fmt.Errorf("%s: %w", ep, err)
					return
				}
				if len(rep.Workloads) != len(workload.Names()) || !rep.Verified {
					errs <- fmt.Errorf("%s: report %+v", ep, rep)
				}
			}()
		}
	}
	// Misbehaving clients on the same primary, during the run.
	for _, junk := range [][]byte{[]byte(strings.Repeat("garbage!", 16)), []byte("VGPU\x01\x00\x01\x00\x00\x00")} {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(junk)
		c.Close()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	get := func(path string) string {
		resp, err := http.Get("http://" + adminAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %s", path, resp.Status)
		}
		return string(b)
	}
	if got := get("/healthz"); got != "ok\n" {
		t.Errorf("/healthz: %q", got)
	}
	var st struct {
		Backend  string
		Sessions []any
	}
	if err := json.Unmarshal([]byte(get("/status")), &st); err != nil || st.Backend != "sim" {
		t.Errorf("/status: %+v %v", st, err)
	}
	metrics := get("/metrics")
	for _, want := range []string{`vgpuha_guest_requests_total{op="launch",status="ok"}`, `vgpuha_guest_frame_errors_total{reason="magic"} 1`, "vgpuha_guest_sessions 0"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	for _, pr := range []*proc{p, p2} {
		pr.cmd.Process.Signal(syscall.SIGTERM)
		if err := pr.cmd.Wait(); err != nil {
			t.Errorf("primary exit after SIGTERM: %v", err)
		}
	}
	if !strings.Contains(p.stderr.String(), "primary stopped") {
		t.Error("primary did not log a clean stop")
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket file left behind: %v", err)
	}
}

// TestGuestFailsOnWrongResult: the guest command's exit status reflects a
// failure to run (here: no hypervisor), never a silent success.
func TestGuestExitStatus(t *testing.T) {
	skipShort(t)
	cmd := exec.Command(labBin, "guest", "--endpoint", "unix://"+filepath.Join(t.TempDir(), "none.sock"), "--workload", "vadd")
	if err := cmd.Run(); err == nil {
		t.Fatal("guest with no hypervisor exited 0")
	}
	cmd = exec.Command(labBin, "guest", "--workload", "nope")
	if err := cmd.Run(); err == nil {
		t.Fatal("guest with an unknown workload exited 0")
	}
}

func TestDemo(t *testing.T) {
	skipShort(t)
	out, err := exec.Command(labBin, "demo").CombinedOutput()
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	verified := 0
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 3 && f[2] == "true" {
			verified++
		}
	}
	if verified != len(workload.Names()) {
		t.Fatalf("demo verified %d workloads, want %d:\n%s", verified, len(workload.Names()), out)
	}
	for _, want := range []string{"SIGKILL primary", "promoted to term 2", "guest resumes its session", "identical to round 1: true",
		drill.TermTakeover.Meaning(), drill.TermGuestPause.Meaning()} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
	if bytes.Contains(out, []byte("loss")) {
		t.Errorf("commit mode's demo speaks of loss:\n%s", out)
	}
}

// TestDemoEpoch: in epoch mode the takeover loses what came after the
// demo's checkpoint, by design: the demo exits 0, names the loss, the
// mode's promise and where the guest went back to, and the guest's rerun
// of round 2 on the standby verifies.
func TestDemoEpoch(t *testing.T) {
	skipShort(t)
	out, err := exec.Command(labBin, "demo", "--mode", "epoch").CombinedOutput()
	if err != nil {
		t.Fatalf("demo --mode epoch: %v\n%s", err, out)
	}
	for _, want := range []string{"epoch 1 cut on the primary and committed on the standby", "loss, as epoch mode allows: " + drill.PromiseOf("epoch").What,
		"lost: the guest's requests after request", "the standby discarded the uncommitted epoch after epoch 1",
		"the guest was told: workload", "resumed session was rolled back", "ran round 2 again from its start", "identical to round 1: true",
		"whose device copy equals everything it wrote: true"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("demo --mode epoch output lacks %q:\n%s", want, out)
		}
	}
}

// TestFrozenPrimaryComesBackFenced: a primary frozen with SIGSTOP is
// replaced by the standby; when it is thawed it learns the newer term on its
// replication link and stops serving instead of acting as a second primary.
func TestFrozenPrimaryComesBackFenced(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	keyFile := writeKey(t, dir)
	replAddr, adminAddr, standbyAdmin := freePort(t), freePort(t), freePort(t)
	sock, standbySock := filepath.Join(dir, "g.sock"), filepath.Join(dir, "s.sock")
	startNode(t, "standby", "--listen", "tcp://"+replAddr, "--replicate.key-file", keyFile,
		"--guest-listen", "unix://"+standbySock, "--admin-listen", standbyAdmin)
	p := startPrimary(t, "--guest-listen", "unix://"+sock, "--admin-listen", adminAddr,
		"--replicate-to", "tcp://"+replAddr, "--replicate.key-file", keyFile)
	waitStatus(t, adminAddr, "protected", nodeStatus.protected)
	if out, err := exec.Command(vgpuhaBin, "status", "--admin", adminAddr).CombinedOutput(); err != nil ||
		!regexp.MustCompile(` primary +1 +true +0 +to_standby +protected +`+replAddr).Match(out) {
		t.Errorf("vgpuha status --admin on the primary: %v\n%s", err, out)
	}
	statusRow := func(addr, what, row string) {
		t.Helper()
		out, err := exec.Command(vgpuhaBin, "status", "--admin", addr).CombinedOutput()
		if err != nil || !regexp.MustCompile(row).Match(out) {
			t.Errorf("vgpuha status --admin on the %s: %v, want a row matching %q:\n%s", what, err, row, out)
		}
	}
	p.cmd.Process.Signal(syscall.SIGSTOP)
	waitStatus(t, standbyAdmin, "promoted", nodeStatus.promoted)
	if out, err := exec.Command(vgpuhaBin, "status", "--admin", standbyAdmin).CombinedOutput(); err != nil ||
		!regexp.MustCompile(` primary +2 +true +0 +none +off `).Match(out) || !strings.Contains(string(out), "promoted to term 2") {
		t.Errorf("vgpuha status --admin on the promoted standby: %v\n%s", err, out)
	}
	p.cmd.Process.Signal(syscall.SIGCONT)
	// Fenced as its server enforces it: the role changes a moment before
	// the view reaches the server (seen under load), and the server then
	// stops serving, which the wait requires.
	waitStatus(t, adminAddr, "fenced and serving no guest", func(s nodeStatus) bool { return s.Role == "fenced" && !s.Serving })
	if resp, err := http.Get("http://" + adminAddr + "/healthz"); err != nil {
		t.Fatal(err)
	} else {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "fenced") {
			t.Errorf("a fenced node's /healthz: %s %q, want 503 saying fenced", resp.Status, body)
		}
	}
	statusRow(adminAddr, "fenced old primary", ` fenced +2 +false +0 +to_standby +unprotected `)
	if _, err := runGuestProc("unix://"+sock, "vadd", 0); err == nil {
		t.Fatal("a fenced primary served a guest")
	}
	if _, err := runGuestProc("unix://"+standbySock, "vadd", 0); err != nil {
		t.Fatalf("the promoted standby does not serve guests: %v", err)
	}
}

// TestReplicationProcesses runs a standby and a primary as separate
// processes, guests that keep their sessions open, and `vgpuha verify`.
// replicatedGuests starts a standby on replAddr and a commit-mode primary
// streaming to it, both with extra flags, runs two guests through every
// workload and checks that verify finds the replica identical; it returns
// the standby.
func replicatedGuests(t *testing.T, dir, keyFile, replAddr string, extra ...string) *proc {
	t.Helper()
	tokenFile := filepath.Join(dir, "admin-token") // verify is a POST: over tcp it needs the admin token
	os.WriteFile(tokenFile, []byte("test-admin-token-0123456789\n"), 0o600)
	adminAddr := freePort(t)
	sock := filepath.Join(dir, "g.sock")

	sb := startNode(t, append([]string{"standby", "--listen", "tcp://" + replAddr, "--replicate.key-file", keyFile}, extra...)...)
	startPrimary(t, append([]string{"--guest-listen", "unix://" + sock, "--admin-listen", adminAddr, "--admin.token-file", tokenFile,
		"--replicate-to", "tcp://" + replAddr, "--replicate.key-file", keyFile, "--mode", "commit"}, extra...)...)

	var holders []*exec.Cmd
	defer func() {
		for _, h := range holders {
			h.Process.Signal(syscall.SIGTERM)
			h.Wait()
		}
	}()
	for i := 0; i < 2; i++ {
		h := exec.Command(labBin, "guest", "--endpoint", "unix://"+sock, "--workload", "all", "--hold")
		stderr := &syncBuffer{}
		h.Stderr = stderr
		if err := h.Start(); err != nil {
			t.Fatal(err)
		}
		holders = append(holders, h)
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(stderr.String(), "holding the session") {
			if time.Now().After(deadline) || h.ProcessState != nil {
				t.Fatalf("guest did not finish its workloads: %s", stderr.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	out, err := exec.Command(vgpuhaBin, "verify", "--admin", adminAddr, "--admin.token-file", tokenFile, "--json").Output()
	if err != nil {
		t.Fatalf("verify: %v\n%s\nstandby log:\n%s", err, out, sb.stderr.String())
	}
	var rep struct {
		Match      bool
		Objects    int
		Bytes      uint64
		Mismatches []any
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("verify output %q: %v", out, err)
	}
	if !rep.Match || rep.Objects < 2*len(workload.Names()) || rep.Bytes == 0 {
		t.Fatalf("verify report: %+v", rep)
	}
	return sb
}

// TestReplicationProcessesWorkers is TestReplicationProcesses' replication
// with every guest session in a GPU worker of its own on both nodes
// (--guest.workers auto: --guest.kernels turns them on) and no one-guest limit.
func TestReplicationProcessesWorkers(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	replicatedGuests(t, dir, writeKey(t, dir), freePort(t), "--guest.kernels", "--guest.workers", "auto", "--guest.max-sessions", "4")
}

func TestReplicationProcesses(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	keyFile := writeKey(t, dir)
	replAddr := freePort(t)
	sb := replicatedGuests(t, dir, keyFile, replAddr)
	// A standby refuses a primary with another key.
	bad := filepath.Join(dir, "bad")
	os.WriteFile(bad, []byte("some-other-key-entirely-123456"), 0o600)
	startPrimary(t, "--guest-listen", "unix://"+filepath.Join(dir, "b.sock"),
		"--replicate-to", "tcp://"+replAddr, "--replicate.key-file", bad)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(sb.stderr.String(), "its replication key differs from this node's") {
		if time.Now().After(deadline) {
			t.Fatalf("standby did not refuse a primary with the wrong key:\n%s", sb.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDrill runs every fault kind once through `vgpuha drill` (CI's share
// of the drills; longer runs are in the closing notes).
func TestDrill(t *testing.T) {
	skipShort(t)
	svg := filepath.Join(t.TempDir(), "drill.svg")
	out, err := exec.Command(labBin, "drill", "--iterations", "5", "--faults", "kill,freeze,standby-kill,switchover,guest-cut", "--json", "--backend", "sim", "--plot", svg).Output()
	if err != nil {
		t.Fatalf("drill: %v\n%s", err, out)
	}
	var rep struct {
		Iterations, Passed int
		LostRequests       int64 `json:"lost_requests"`
		Records            []struct {
			Fault  string
			Passed bool
		}
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("drill output %q: %v", out, err)
	}
	if rep.Iterations != 5 || rep.Passed != 5 || rep.LostRequests != 0 {
		t.Fatalf("drill report: %+v", rep)
	}
	if b, err := os.ReadFile(svg); err != nil || !bytes.Contains(b, []byte("</svg>")) || bytes.Count(b, []byte("<rect")) < 4 {
		t.Fatalf("drill plot: %v, %d bytes", err, len(b))
	}
}

// TestDrillStateBytes: `vgpuha drill --state-bytes` has its guest hold
// 64 MiB while the standby is resynced and the faults strike (a takeover,
// a fail-back that resyncs the old primary's host, a lost standby), and
// every byte reads back equal after each iteration, wherever the guest
// runs; with a coordinator too.
func TestDrillStateBytes(t *testing.T) {
	skipShort(t)
	for _, args := range [][]string{{"--faults", "kill,failback,standby-kill", "--iterations", "3"}, {"--coordinator", "--coordinator.ttl", "4s", "--faults", "kill,standby-loss", "--iterations", "2"}} {
		out, err := exec.Command(labBin, append([]string{"drill", "--state-bytes", "64MiB", "--json", "--backend", "sim", "--topology", "loopback"}, args...)...).Output()
		if err != nil {
			t.Fatalf("drill %v: %v\n%s", args, err, out)
		}
		var rep struct {
			Iterations, Passed int
			StateBytes         uint64                `json:"state_bytes"`
			BytesVerified      uint64                `json:"bytes_verified"`
			PauseMS            struct{ P99 float64 } `json:"pause_ms"`
			Records            []struct {
				Fault         string
				StateBytes    uint64 `json:"state_bytes"`
				BytesVerified uint64 `json:"bytes_verified"`
			}
		}
		if err := json.Unmarshal(out, &rep); err != nil {
			t.Fatalf("drill output %q: %v", out, err)
		}
		if rep.Passed != rep.Iterations || rep.StateBytes != 64<<20 || rep.BytesVerified != uint64(rep.Iterations)*64<<20 || rep.PauseMS.P99 == 0 {
			t.Fatalf("drill %v report: %s", args, out)
		}
		for _, r := range rep.Records {
			if r.StateBytes != 64<<20 || r.BytesVerified != r.StateBytes {
				t.Errorf("%s: %d of %d state bytes verified", r.Fault, r.BytesVerified, r.StateBytes)
			}
		}
	}
}

// TestDrillShm: the failover drill with its guest on shared-memory rings
// (shm+unix on both nodes): every fault that does not need the guest's
// proxy passes, and no request is lost.
func TestDrillShm(t *testing.T) {
	skipShort(t)
	if runtime.GOOS != "linux" {
		t.Skip("shared memory needs Linux")
	}
	out, err := exec.Command(labBin, "drill", "--transport", "shm", "--iterations", "4", "--faults", "kill,freeze,standby-kill,switchover", "--json", "--backend", "sim").Output()
	if err != nil {
		t.Fatalf("drill: %v\n%s", err, out)
	}
	var rep struct {
		Iterations, Passed int
		LostRequests       int64 `json:"lost_requests"`
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("drill output %q: %v", out, err)
	}
	if rep.Iterations != 4 || rep.Passed != 4 || rep.LostRequests != 0 {
		t.Fatalf("drill report: %+v", rep)
	}
}

// TestDrillCoordinated runs the coordinator's faults once each through
// `vgpuha drill --coordinator` (a 3-member etcd cluster of processes): no
// request lost, the standby takes over only where the primary failed, and
// never did two nodes answer guests at once.
func TestDrillCoordinated(t *testing.T) {
	skipShort(t)
	// 4 s leases: a race-built suite on 2 busy cores can miss a 2 s lease's
	// renewal, and a healthy primary then rightly stands down mid-drill.
	out, err := exec.Command(labBin, "drill", "--coordinator", "--coordinator.ttl", "4s", "--iterations", "5", "--faults", "kill,freeze,partition,standby-loss,etcd-member-kill",
		"--json", "--backend", "sim").Output()
	if err != nil {
		t.Fatalf("drill: %v\n%s", err, out)
	}
	var rep struct {
		Iterations, Passed int
		LostRequests       int64 `json:"lost_requests"`
		Records            []struct {
			Fault         string
			Coordinated   bool
			BothServingMS float64 `json:"both_serving_ms"`
		}
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("drill output %q: %v", out, err)
	}
	if rep.Iterations != 5 || rep.Passed != 5 || rep.LostRequests != 0 {
		t.Fatalf("drill report: %s", out)
	}
	for _, r := range rep.Records {
		if !r.Coordinated || r.BothServingMS != 0 {
			t.Errorf("%s: coordinated %v, both serving %v ms", r.Fault, r.Coordinated, r.BothServingMS)
		}
	}
}

// TestDrillRefusesBadFlags: what the drill cannot run is refused before
// any iteration (no pair is started), naming what would be valid.
func TestDrillRefusesBadFlags(t *testing.T) {
	skipShort(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--faults", "kill,bogus"}, `unknown fault "bogus" (valid: kill, freeze, standby-kill, switchover, guest-cut, partition, failback, standby-freeze, standby-freeze-2s, guest-start-after-failover, standby-loss, etcd-member-kill, blackout-100ms, blackout-200ms, blackout-600ms, freeze-100ms, freeze-200ms, freeze-600ms, etcd-freeze)`},
		{[]string{"--faults", "etcd-member-kill"}, `fault "etcd-member-kill" needs --coordinator`},
		{[]string{"--coordinator", "--faults", "failback"}, `fault "failback" is not drilled with --coordinator`},
		{[]string{"--coordinator", "--mode", "epoch"}, `--coordinator is not drilled in epoch mode`},
		{[]string{"--side-by-side"}, `--side-by-side compares with --coordinator`},
		{[]string{"--coordinator", "--coordinator.ttl", "500ms"}, `--coordinator.ttl: out of range: want a duration from 1s`},
		{[]string{"--topology", "bogus"}, `unknown topology "bogus" (valid: auto, netns, loopback)`},
		{[]string{"--iterations", "0"}, "--iterations: out of range"},
		{[]string{"--mode", "epoch", "--faults", "freeze"}, `fault "freeze" is not drilled in epoch mode (valid there: kill)`},
		{[]string{"--topology", "loopback", "--faults", "partition"}, `fault "partition" needs network namespaces`},
		{[]string{"--mode", "bogus"}, `--mode: want sync, commit, epoch`},
		{[]string{"--state-bytes", "1000"}, "--state-bytes must be a multiple of 1 MiB"},
		{[]string{"--state-bytes", "99999999999GiB"}, `--state-bytes: out of range`},
		{[]string{"--transport", "shm", "--faults", "guest-cut"}, `fault "guest-cut" is not drilled over --transport shm`},
		{[]string{"--transport", "vsock"}, `unknown transport "vsock"`},
	} {
		cmd := exec.Command(labBin, append([]string{"drill", "--backend", "sim"}, tc.args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err == nil || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("drill %v: %v, stderr %q, want %q", tc.args, err, stderr.String(), tc.want)
		}
		if len(out) > 0 || strings.Contains(stderr.String(), "topology:") {
			t.Errorf("drill %v ran before refusing:\n%s%s", tc.args, out, stderr.String())
		}
	}
}

// TestDoubleFailover: A replicates to B, which is set to replicate to C once
// promoted. A guest runs while A is killed (B takes over and resyncs C) and
// then B is killed (C takes over); the guest finishes every round on C with
// results identical to the fault-free round.
func TestDoubleFailover(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	keyFile := writeKey(t, dir)
	replB, replC, adminA, adminB, adminC := freePort(t), freePort(t), freePort(t), freePort(t), freePort(t)
	sockA, sockB, sockC := filepath.Join(dir, "a.sock"), filepath.Join(dir, "b.sock"), filepath.Join(dir, "c.sock")
	startNode(t, "standby", "--listen", "tcp://"+replC, "--replicate.key-file", keyFile, "--guest-listen", "unix://"+sockC, "--admin-listen", adminC)
	b := startNode(t, "standby", "--listen", "tcp://"+replB, "--replicate.key-file", keyFile, "--guest-listen", "unix://"+sockB,
		"--replicate-to", "tcp://"+replC, "--admin-listen", adminB)
	a := startPrimary(t, "--guest-listen", "unix://"+sockA, "--replicate-to", "tcp://"+replB, "--replicate.key-file", keyFile,
		"--admin-listen", adminA)
	waitStatus(t, adminA, "protected", nodeStatus.protected)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	g, err := pvdriver.Open(ctx, "unix://"+sockA, pvdriver.Options{GuestName: "g", Failover: []string{"unix://" + sockB, "unix://" + sockC}})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	ws, _ := workload.Select("all")
	want := map[string]string{}
	for round := 0; round < 3; round++ {
		for _, w := range ws {
			r, err := w.Run(context.Background(), g, 0)
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
			if prev, ok := want[r.Name]; !r.Verified || ok && prev != r.Checksum {
				t.Fatalf("round %d %s: verified %v, checksum %s, fault-free %s", round, r.Name, r.Verified, r.Checksum, prev)
			}
			want[r.Name] = r.Checksum
		}
		switch round {
		case 0:
			a.cmd.Process.Kill()
			waitStatus(t, adminB, "promoted and protected by C", func(s nodeStatus) bool {
				return s.promoted() && s.protected()
			})
		case 1:
			b.cmd.Process.Kill()
			waitStatus(t, adminC, "promoted", nodeStatus.promoted)
		}
	}
	if fo := g.Failovers(); len(fo) != 2 || fo[1].Term != 3 {
		t.Fatalf("failovers: %+v", fo)
	}
}

// TestDrillPartition cuts the primary-standby link between two network
// namespaces: the standby takes over, the healed old primary is fenced, and
// the guest either is told its partition-time work was rolled back or lost
// nothing.
func TestDrillPartition(t *testing.T) {
	skipShort(t)
	if !drill.NetnsAvailable() {
		t.Skip("network namespaces cannot be made here (needs root and iproute2): partition drills skipped")
	}
	out, err := exec.Command(labBin, "drill", "--iterations", "1", "--faults", "partition", "--topology", "netns", "--json", "--backend", "sim").Output()
	if err != nil {
		t.Fatalf("drill: %v\n%s", err, out)
	}
	var rep struct {
		Passed  int
		Records []struct {
			Fenced     bool `json:"old_primary_fenced"`
			RolledBack bool `json:"rolled_back"`
		}
	}
	if err := json.Unmarshal(out, &rep); err != nil || rep.Passed != 1 || !rep.Records[0].Fenced {
		t.Fatalf("partition drill: %v %s", err, out)
	}
	t.Logf("guest told of a rollback: %v (else commit mode had held its replies and nothing was lost)", rep.Records[0].RolledBack)
}

// TestDrillEpoch: in epoch mode a kill between a synchronization and the
// checkpointer's cut rolls the guest back to its last committed epoch, and
// the promoted standby's GPU state matches that checkpoint exactly.
func TestDrillEpoch(t *testing.T) {
	skipShort(t)
	out, err := exec.Command(labBin, "drill", "--mode", "epoch", "--iterations", "2", "--json", "--backend", "sim").Output()
	if err != nil {
		t.Fatalf("drill: %v\n%s", err, out)
	}
	var rep struct {
		Passed  int
		Records []struct {
			RolledBack bool `json:"rolled_back"`
		}
	}
	if err := json.Unmarshal(out, &rep); err != nil || rep.Passed != 2 || !rep.Records[0].RolledBack {
		t.Fatalf("epoch drill: %v %s", err, out)
	}
}

// TestRun runs `vgpuha run` around the MMIO guest in each tracing mode:
// the guest's aperture writes reach the device (its read-back verifies),
// and run reports the tracer's counts when the guest exits.
func TestRun(t *testing.T) {
	skipShort(t)
	for _, mode := range []string{"insn", "page", "auto", "uffd"} {
		t.Run(mode, func(t *testing.T) {
			if mode == "uffd" && mmiotrace.UffdAvailable() != nil {
				t.Skipf("uffd mode needs Linux 6.7+: %v", mmiotrace.UffdAvailable())
			}
			cmd := exec.Command(vgpuhaBin, "run", "--mmio", mode, "--log.level", "warn", "--",
				labBin, "mmio-guest", "--workload", "doorbell", "--writes", "500", "--aperture-bytes", "65536")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("%v\n%s", err, stderr.String())
			}
			var res struct {
				Mode     string `json:"mode"`
				Verified bool   `json:"verified"`
			}
			if err := json.Unmarshal(out, &res); err != nil || res.Mode != mode || !res.Verified {
				t.Fatalf("guest said %s (%v)", out, err)
			}
			pinned := "not pinned" // only insn and auto mode pin the guest's threads
			if mode == "insn" || mode == "auto" {
				pinned = "pinned to one CPU"
			}
			if !strings.Contains(stderr.String(), "guest exited; mmio ("+mode+"):") || !strings.Contains(stderr.String(), pinned) {
				t.Fatalf("run's report:\n%s", stderr.String())
			}
		})
	}
}

// TestAperturePrimaryKilled SIGKILLs a primary process that traces a
// guest's aperture with ptrace (page mode) while the guest holds pages
// write-protected. The guest must survive (its driver unprotects its
// apertures when the connection drops), keep writing, resume on the
// promoted standby, and find every write in the device copy there.
func TestAperturePrimaryKilled(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	keyFile := writeKey(t, dir)
	repl := freePort(t)
	sockA, sockB := filepath.Join(dir, "a.sock"), filepath.Join(dir, "b.sock")
	b := startNode(t, "standby", "--listen", "tcp://"+repl, "--replicate.key-file", keyFile, "--guest-listen", "unix://"+sockB, "--mmio", "page")
	a := startPrimary(t, "--guest-listen", "unix://"+sockA, "--replicate-to", "tcp://"+repl, "--replicate.key-file", keyFile, "--mmio", "page")
	waitLog(t, a, "primary is protected")

	g := mmiotrace.GuestCommand(exec.Command(labBin, "mmio-guest", "--addr", "unix://"+sockA, "--failover", "unix://"+sockB,
		"--workload", "failover", "--writes", "3000", "--aperture-bytes", "262144"))
	stdin, _ := g.StdinPipe()
	stdout, _ := g.StdoutPipe()
	g.Stderr = os.Stderr
	if err := g.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() || sc.Text() != `{"paused":true}` {
		t.Fatalf("guest said %q", sc.Text())
	}
	a.cmd.Process.Kill() // the tracer dies with it; the aperture's clean pages are still write-protected
	a.cmd.Wait()
	time.Sleep(50 * time.Millisecond) // let the guest driver see its connection drop
	fmt.Fprintln(stdin)
	var res struct {
		Failovers int  `json:"failovers"`
		Verified  bool `json:"verified"`
	}
	for sc.Scan() {
		json.Unmarshal(sc.Bytes(), &res)
	}
	if err := mmiotrace.WaitExit(g); err != nil {
		t.Fatalf("guest: %v (standby log:\n%s)", err, b.stderr.String())
	}
	if res.Failovers != 1 || !res.Verified {
		t.Fatalf("after the primary was killed: %+v", res)
	}
}

// TestStalledStandbyDoesNotDepose: a standby frozen (SIGSTOP) for 600 ms
// while a healthy primary keeps sending must, on waking, read what queued
// up before it judges: it stays a standby and the primary keeps serving.
func TestStalledStandbyDoesNotDepose(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts agent processes")
	}
	for _, det := range []string{"fixed", "phi"} {
		t.Run(det, func(t *testing.T) {
			dir := t.TempDir()
			keyFile := writeKey(t, dir)
			repl, adminP, adminS := freePort(t), freePort(t), freePort(t)
			sb := startNode(t, "standby", "--listen", "tcp://"+repl, "--replicate.key-file", keyFile, "--failover.detector", det,
				"--guest-listen", "unix://"+filepath.Join(dir, "s.sock"), "--admin-listen", adminS)
			startPrimary(t, "--guest-listen", "unix://"+filepath.Join(dir, "g.sock"), "--admin-listen", adminP,
				"--replicate-to", "tcp://"+repl, "--replicate.key-file", keyFile)
			waitStatus(t, adminP, "protected", nodeStatus.protected)
			for i := 0; i < 3; i++ {
				sb.cmd.Process.Signal(syscall.SIGSTOP)
				time.Sleep(600 * time.Millisecond) // the fault itself: how long the standby is stalled
				sb.cmd.Process.Signal(syscall.SIGCONT)
				waitStatus(t, adminS, "answering again", func(nodeStatus) bool { return true })
				time.Sleep(300 * time.Millisecond) // past the drain window and the detector's timeout
				if st := waitStatus(t, adminS, "answering", func(nodeStatus) bool { return true }); st.Role != "standby" {
					t.Fatalf("stall %d: the stalled standby deposed a healthy primary: role %q", i+1, st.Role)
				}
			}
			waitStatus(t, adminP, "still a protected primary", func(s nodeStatus) bool { return s.Role == "primary" && s.protected() })
		})
	}
}

// TestHelpAndBadValues: every command's --help goes to stdout with exit 0
// and lists its flags with two dashes; a bad value exits non-zero naming
// the flag.
func TestHelpAndBadValues(t *testing.T) {
	skipShort(t)
	for name := range agent.Commands() {
		cmd := exec.Command(vgpuhaBin, name, "--help")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Errorf("vgpuha %s --help: %v (stderr %q)", name, err, stderr.String())
		}
		if !strings.Contains(stdout.String(), "Usage: vgpuha "+name) {
			t.Errorf("vgpuha %s --help printed no usage on stdout: %q", name, stdout.String())
		}
		if regexp.MustCompile(`\n  -[^-]`).MatchString(stdout.String()) {
			t.Errorf("vgpuha %s --help lists a flag with one dash", name)
		}
	}
	for _, args := range [][]string{{"help"}, {"--help"}, {"help", "primary"}, {"version"}, {"--version"}} {
		if out, err := exec.Command(vgpuhaBin, args...).Output(); err != nil || len(out) == 0 {
			t.Errorf("vgpuha %v: %v, %q", args, err, out)
		}
	}
	for _, c := range []struct{ args []string }{
		{[]string{"primary", "--log.level", "bogus"}},
		{[]string{"primary", "--log.format", "bogus"}},
		{[]string{"standby", "--failover.detector", "bogus", "--replicate.key-file", "/dev/null"}},
		{[]string{"primary", "--mode", "bogus"}},
	} {
		out, err := exec.Command(vgpuhaBin, c.args...).CombinedOutput()
		flagName := strings.TrimPrefix(c.args[1], "--")
		if err == nil || !strings.Contains(string(out), flagName) && !strings.Contains(string(out), "bogus") {
			t.Errorf("vgpuha %v: %v, %q; want a failure naming %s", c.args, err, out, flagName)
		}
	}
}

// TestDrillFailback: the primary dies, its host comes back as a standby of
// the promoted node, is resynced and takes the role back; the guest follows
// both moves and loses nothing.
func TestDrillFailback(t *testing.T) {
	skipShort(t)
	out, err := exec.Command(labBin, "drill", "--iterations", "2", "--faults", "failback", "--json", "--backend", "sim").Output()
	if err != nil {
		t.Fatalf("drill: %v\n%s", err, out)
	}
	var rep struct {
		Iterations, Passed int
		LostRequests       int64 `json:"lost_requests"`
		Records            []struct {
			Failovers int
			Fenced    bool `json:"old_primary_fenced"`
		}
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("drill output %q: %v", out, err)
	}
	if rep.Iterations != 2 || rep.Passed != 2 || rep.LostRequests != 0 || rep.Records[0].Failovers != 2 || !rep.Records[0].Fenced {
		t.Fatalf("failback drill: %+v", rep)
	}
}

// TestDrillStandbyFreezeAndLateGuest: a standby frozen 600 ms never deposes
// the healthy primary, and a guest started after a takeover is served.
func TestDrillStandbyFreezeAndLateGuest(t *testing.T) {
	skipShort(t)
	out, err := exec.Command(labBin, "drill", "--iterations", "2", "--faults", "standby-freeze,guest-start-after-failover", "--json", "--backend", "sim").Output()
	if err != nil {
		t.Fatalf("drill: %v\n%s", err, out)
	}
	var rep struct {
		Iterations, Passed int
		LostRequests       int64 `json:"lost_requests"`
	}
	if err := json.Unmarshal(out, &rep); err != nil || rep.Iterations != 2 || rep.Passed != 2 || rep.LostRequests != 0 {
		t.Fatalf("drill report %s: %+v %v", out, rep, err)
	}
}

// TestSystemdReadiness: under a Type=notify unit the primary says READY=1
// once it serves guests; the units in contrib/systemd pass systemd-analyze
// where it is installed.
func TestSystemdReadiness(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	notify := filepath.Join(dir, "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notify, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cmd := exec.Command(vgpuhaBin, "primary", "--guest-listen", "unix://"+filepath.Join(dir, "g.sock"), "--backend", "sim")
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+notify)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	buf := make([]byte, 256)
	n, err := conn.Read(buf)
	if err != nil || !strings.Contains(string(buf[:n]), "READY=1") {
		t.Fatalf("no READY=1 from the primary: %q, %v", buf[:n], err)
	}
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Log("systemd-analyze not installed: unit files not verified here")
		return
	}
	bin, err := filepath.Abs(vgpuhaBin)
	if err != nil {
		t.Fatal(err)
	}
	for _, unit := range []string{"vgpuha-primary.service", "vgpuha-standby.service"} {
		// The units name the installed binary; verify them against this one.
		text, err := os.ReadFile(filepath.Join("..", "..", "contrib", "systemd", unit))
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, unit)
		os.WriteFile(path, bytes.ReplaceAll(text, []byte("/usr/local/bin/vgpuha"), []byte(bin)), 0o644)
		if out, err := exec.Command("systemd-analyze", "verify", path).CombinedOutput(); err != nil {
			t.Errorf("systemd-analyze verify %s: %v\n%s", unit, err, out)
		}
		out, _ := exec.Command("systemd-analyze", "security", "--offline=yes", path).CombinedOutput()
		m := regexp.MustCompile(`Overall exposure level for .*: ([0-9.]+)`).FindSubmatch(out)
		if m == nil {
			t.Errorf("systemd-analyze security %s: no score in\n%s", unit, out)
		} else if score, _ := strconv.ParseFloat(string(m[1]), 64); score > 5.0 {
			t.Errorf("systemd-analyze security %s: exposure %.1f, want at most 5.0\n%s", unit, score, out)
		}
	}
}

// TestDrillSIGTERMLeavesNothing: a drill stopped by SIGTERM mid-run exits
// non-zero saying so, and leaves no agent process, network namespace or
// temporary directory behind.
func TestDrillSIGTERMLeavesNothing(t *testing.T) {
	skipShort(t)
	tmp := t.TempDir()
	cmd := exec.Command(labBin, "drill", "--iterations", "50", "--backend", "sim")
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(stderr.String(), "iteration 1/50") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // into the second iteration's pair
	cmd.Process.Signal(syscall.SIGTERM)
	err := cmd.Wait()
	if err == nil || !strings.Contains(stderr.String(), "interrupted") {
		t.Fatalf("drill after SIGTERM: %v\n%s", err, stderr.String())
	}
	if entries, _ := os.ReadDir(tmp); len(entries) != 0 {
		t.Errorf("left behind in TMPDIR: %v", entries)
	}
	prefix := fmt.Sprintf("vgp-%d-", cmd.Process.Pid%100000)
	if out, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(out), prefix) ||
		strings.Contains(string(out), strings.Replace(prefix, "vgp-", "vgs-", 1)) {
		t.Errorf("network namespaces left behind:\n%s", out)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(tmp)) {
			t.Errorf("an agent is still running: %s", bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
		}
	}
}

// TestSIGHUPIgnored: SIGHUP neither kills a node nor stops it serving (the
// node logs as JSON here: --log.format json).
// TestSIGHUPReloadsAdminTokens: SIGHUP never stops a node; it reloads the
// admin token file, so a token is rotated without a restart (add the new
// one, move clients, remove the old one), and a bad file keeps the tokens
// in use.
func TestSIGHUPReloadsAdminTokens(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	sock, tokens, adminAddr := filepath.Join(dir, "g.sock"), filepath.Join(dir, "tokens"), freePort(t)
	const old, next = "the-old-admin-token-0123456789", "the-new-admin-token-0123456789"
	os.WriteFile(tokens, []byte(old+"\n"), 0o600)
	p := startPrimary(t, "--guest-listen", "unix://"+sock, "--backend", "sim", "--log.format", "json",
		"--admin-listen", adminAddr, "--admin.token-file", tokens)
	// POST /epoch on a primary without a standby: 409 when the token is
	// good, 401 when it is not.
	code := func(tok string) int {
		req, _ := http.NewRequest(http.MethodPost, "http://"+adminAddr+"/epoch", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	reloads := 0
	hup := func(content, logged string) {
		t.Helper()
		os.WriteFile(tokens, []byte(content), 0o600)
		p.cmd.Process.Signal(syscall.SIGHUP)
		reloads++
		deadline := time.Now().Add(10 * time.Second)
		for strings.Count(p.stderr.String(), `"msg":"SIGHUP: admin tokens`) < reloads {
			if time.Now().After(deadline) {
				t.Fatalf("no reload logged:\n%s", p.stderr.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
		if !strings.Contains(p.stderr.String(), logged) {
			t.Fatalf("log lacks %q:\n%s", logged, p.stderr.String())
		}
	}
	if code(old) != http.StatusConflict || code(next) != http.StatusUnauthorized {
		t.Fatalf("before the rotation: old %d, new %d", code(old), code(next))
	}
	hup(next+"\n"+old+"\n", `"tokens":2`)
	if code(old) != http.StatusConflict || code(next) != http.StatusConflict {
		t.Fatalf("during the rotation: old %d, new %d", code(old), code(next))
	}
	hup(next+"\n", `"tokens":1`)
	if code(old) != http.StatusUnauthorized || code(next) != http.StatusConflict {
		t.Fatalf("after the rotation: old %d, new %d", code(old), code(next))
	}
	hup("short\n", "admin tokens not reloaded")
	if code(next) != http.StatusConflict {
		t.Fatal("a bad token file dropped the token in use")
	}
	if _, err := runGuestProc("unix://"+sock, "vadd", 0); err != nil {
		t.Fatalf("after SIGHUP the primary does not serve: %v", err)
	}
}

// TestConfigFiles: a primary and a standby start from one TOML file each
// (dotted flags as tables); the environment overrides the file, a flag
// overrides both, --config.show says which won, and an unknown key is an
// error naming it.
func TestConfigFiles(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	keyFile := writeKey(t, dir)
	repl, adminP, adminS := freePort(t), freePort(t), freePort(t)
	standbyConf := filepath.Join(dir, "standby.toml")
	os.WriteFile(standbyConf, []byte(fmt.Sprintf("listen = %q\nguest-listen = %q\nadmin-listen = %q\nbackend = \"sim\"\n\n[replicate]\nkey-file = %q\n",
		"tcp://"+repl, "unix://"+filepath.Join(dir, "s.sock"), adminS, keyFile)), 0o600)
	primaryConf := filepath.Join(dir, "primary.toml")
	os.WriteFile(primaryConf, []byte(fmt.Sprintf("guest-listen = %q\nadmin-listen = %q\nreplicate-to = %q\nmode = \"sync\"\n\n[replicate]\nkey-file = %q\n\n[log]\nlevel = \"debug\"\n",
		"unix://"+filepath.Join(dir, "g.sock"), adminP, "tcp://"+repl, keyFile)), 0o600)

	show := exec.Command(vgpuhaBin, "primary", "--config", primaryConf, "--config.show", "--log.level", "warn")
	show.Env = append(os.Environ(), "VGPUHA_MODE=commit")
	out, err := show.Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`--log.level\s+warn\s+flag`, `--mode\s+commit\s+env`, `--replicate-to\s+tcp://\S+\s+file`,
		`--replicate.key-file\s+` + regexp.QuoteMeta(keyFile) + `\s+file`, `--guest.max-sessions\s+64\s+default`} {
		if !regexp.MustCompile(want).Match(out) {
			t.Errorf("--config.show does not match %s:\n%s", want, out)
		}
	}
	bad := filepath.Join(dir, "bad.toml")
	os.WriteFile(bad, []byte("gust-listen = \"unix:///x\"\n"), 0o600)
	if out, err := exec.Command(vgpuhaBin, "primary", "--config", bad).CombinedOutput(); err == nil || !strings.Contains(string(out), "gust-listen") {
		t.Errorf("an unknown key: %v %s", err, out)
	}

	startNode(t, "standby", "--config", standbyConf)
	startNode(t, "primary", "--config", primaryConf)
	waitStatus(t, adminP, "protected from its config file", nodeStatus.protected)
	waitStatus(t, adminS, "answering", isRole("standby"))
}

// TestLiveBenches: `bench pv --endpoint` and `bench replicate --endpoint`
// run in their own process against a running primary (replicating in
// commit mode to a standby process) and report the live rows beside the
// in-process backend's, with figures.
func TestLiveBenches(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	keyFile := writeKey(t, dir)
	replAddr := freePort(t)
	scheme := "unix"
	if runtime.GOOS == "linux" {
		scheme = "shm+unix"
	}
	endpoint := scheme + "://" + filepath.Join(dir, "g.sock")
	startNode(t, "standby", "--listen", "tcp://"+replAddr, "--replicate.key-file", keyFile, "--backend", "sim")
	startPrimary(t, "--guest-listen", endpoint, "--backend", "sim",
		"--replicate-to", "tcp://"+replAddr, "--replicate.key-file", keyFile, "--mode", "commit")

	out, err := exec.Command(labBin, "bench", "pv", "--endpoint", endpoint, "--backend", "sim",
		"--rounds", "1", "--batch", "50", "--bulk-bytes", "1048576", "--json").Output()
	if err != nil {
		t.Fatalf("bench pv --endpoint: %v\n%s", err, out)
	}
	var pv []bench.PVRow
	if err := json.Unmarshal(out, &pv); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	seen := map[string]bool{}
	for _, r := range pv {
		if r.NsPerOp <= 0 {
			t.Errorf("row without a figure: %+v", r)
		}
		seen[r.Op+"/"+r.Transport] = true
	}
	for _, op := range []string{"sync_call_64B", "async_launch", "bulk_htod_1MiB"} {
		if !seen[op+"/direct-sim"] || !seen[op+"/live-"+scheme] {
			t.Errorf("bench pv --endpoint lacks %s in-process or live: %s", op, out)
		}
	}

	out, err = exec.Command(labBin, "bench", "replicate", "--endpoint", endpoint, "--backend", "sim",
		"--rounds", "1", "--calls", "50", "--bulk-bytes", "1048576", "--json").Output()
	if err != nil {
		t.Fatalf("bench replicate --endpoint: %v\n%s", err, out)
	}
	var rep bench.ReplicateReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	rows := map[string]bool{}
	for _, r := range rep.Throughput {
		rows[r.Path] = r.MBPerSec > 0
	}
	if !rows["raw tcp link"] || !rows["direct-sim"] || !rows["live-"+scheme] || rep.Throughput[0].VsTCPCopy != 1 {
		t.Errorf("bulk rows: %+v", rep.Throughput)
	}
	calls := map[string]bool{}
	for _, r := range rep.Latency {
		if r.NsPerOp <= 0 {
			t.Errorf("latency row without a figure: %+v", r)
		}
		calls[r.Call+"/"+r.Mode] = true
	}
	for _, c := range []string{"copy_htod_64B", "copy_dtoh_64B"} {
		if !calls[c+"/direct-sim"] || !calls[c+"/live-"+scheme] {
			t.Errorf("bench replicate --endpoint lacks %s rows: %+v", c, rep.Latency)
		}
	}
}

// TestBenchResync: `bench resync` with its nodes inside its own process
// and, with --processes, as processes of their own; each row's standby is
// verified identical, carried every snapshot byte (and the guests' writes
// meanwhile) and names its slowest calls.
func TestBenchResync(t *testing.T) {
	skipShort(t)
	for _, placement := range [][]string{nil, {"--processes"}} {
		args := append([]string{"bench", "resync", "--backend", "sim", "--sizes", "64MiB", "--baseline", "300ms", "--json"}, placement...)
		out, err := exec.Command(labBin, args...).Output()
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		var rows []bench.ResyncBenchRow
		if err := json.Unmarshal(out, &rows); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if len(rows) != 1 {
			t.Fatalf("%v: %d rows: %s", placement, len(rows), out)
		}
		r := rows[0]
		if !r.Verified || r.ResyncSeconds <= 0 || r.OpsPerSecDuring <= 0 || len(r.Slowest) == 0 || r.LongestCall == "" {
			t.Errorf("%v: %+v", placement, r)
		}
		if r.CarriedMBps < r.ResyncMBps || r.CarriedVsLink <= 0 {
			t.Errorf("%v: the link carried %.0f MB/s, less than the snapshot's %.0f", placement, r.CarriedMBps, r.ResyncMBps)
		}
		if r.SnapshotSeconds <= 0 || r.SnapshotSeconds > r.ResyncSeconds || math.Abs(r.SnapshotSeconds+r.CatchUpSeconds-r.ResyncSeconds) > 1e-9 {
			t.Errorf("%v: resync %.3f s split into snapshot %.3f s and catch-up %.3f s", placement, r.ResyncSeconds, r.SnapshotSeconds, r.CatchUpSeconds)
		}
	}
}
