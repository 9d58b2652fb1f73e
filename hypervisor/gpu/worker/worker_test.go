package worker_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/gpu/worker"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/internal/node"
	"github.com/vgpuha/vgpuha/kernels"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// TestMain lets this test binary run as a GPU worker (the Backends the
// tests make run it again).
func TestMain(m *testing.M) {
	worker.RunIfAsked(openTestSpec)
	if os.Getenv(nodeEnv) != "" {
		runDyingNode()
	}
	os.Exit(m.Run())
}

// nodeEnv makes this test binary a node for TestWorkersDieWithNode: it
// starts workers, opens a context, prints the workers' pids and waits to
// be killed.
const nodeEnv = "VGPUHA_WORKER_TEST_NODE"

func runDyingNode() {
	be, err := worker.New(worker.Config{Spec: simSpec, Spares: 1})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	if _, err := be.NewContext(1<<40, 1<<30); err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("worker", be.Workers()[0].Pid)
	select {}
}

// gatedSpec, then a directory, names a software GPU whose workers open
// it only while the directory holds a file named open; a worker held
// says so with a file named held.PID.
const gatedSpec = "test:gated-sim:"

func openTestSpec(spec string) (gpu.Backend, error) {
	if dir, ok := strings.CutPrefix(spec, gatedSpec); ok {
		for held := false; ; held = true {
			if _, err := os.Stat(filepath.Join(dir, "open")); err == nil {
				return sim.New(1 << 30), nil
			}
			if !held {
				os.WriteFile(filepath.Join(dir, "held."+strconv.Itoa(os.Getpid())), nil, 0o600)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return node.OpenWorkerSpec(spec)
}

// simWorkers starts a Backend whose workers run the software GPU, as a
// node with --guest.workers on opens it.
func simWorkers(t testing.TB) *worker.Backend {
	t.Helper()
	be, err := node.GPU{Name: "sim", SimMemoryBytes: 1 << 30, Workers: true, SpareContexts: 1}.Open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	return be.(*worker.Backend)
}

// startWorkers starts a Backend with cfg, closed when t ends.
func startWorkers(t testing.TB, cfg worker.Config) *worker.Backend {
	t.Helper()
	be, err := worker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	return be
}

const simSpec = `{"Name":"sim","SimMemoryBytes":1073741824,"OneContext":true}`

func newContext(t testing.TB, be gpu.Backend, base uint64) gpu.Context {
	t.Helper()
	c, err := be.NewContext(base, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func loadKernel(t testing.TB, c gpu.Context, name string) gpu.Function {
	t.Helper()
	raw, err := kernels.Image(name)
	if err != nil {
		t.Fatal(err)
	}
	img, err := abi.DecodeModuleImage(raw)
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.LoadModule(img)
	if err != nil {
		t.Fatal(err)
	}
	f, err := c.Function(m, name)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) + seed
	}
	return b
}

// TestContextInWorker runs every kind of call through a worker and checks
// its effect: copies of every size (inline, through the shared memory,
// and in pieces larger than it), memsets, device-to-device copies, a
// kernel, streams, checksums, a backend error's status; the worker ends
// and is reaped when the context closes.
func TestContextInWorker(t *testing.T) {
	be := startWorkers(t, worker.Config{Spec: simSpec, SharedBytes: 64 << 10})
	if be.Name() != "sim" || !be.ChecksEveryAccess() || !gpu.IsolatesContexts(be) {
		t.Fatalf("backend described as %q, checks every access %v", be.Name(), be.ChecksEveryAccess())
	}
	if info, err := be.DeviceInfo(); err != nil || info.Name != "vgpuha software GPU" || info.TotalMem != 1<<30 {
		t.Fatalf("device info %+v, %v", info, err)
	}
	const base, size = 1 << 40, 1 << 20
	c := newContext(t, be, base)
	if got, _ := c.Window(); got != base {
		t.Fatalf("window at %#x, asked %#x", got, base)
	}
	if err := c.Alloc(base, size); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, 1, 4096, 16 << 10, 16<<10 + 1, 64 << 10, 200_000, size} {
		want := pattern(n, byte(n))
		if err := c.CopyHtoD(base, want, 0); err != nil {
			t.Fatalf("CopyHtoD of %d bytes: %v", n, err)
		}
		got := make([]byte, n)
		if err := c.CopyDtoH(got, base, 0); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("CopyDtoH of %d bytes: %v, equal %v", n, err, bytes.Equal(got, want))
		}
	}
	s, err := c.CreateStream()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Memset(base, 4, 0x01020304, 8, s); err != nil {
		t.Fatal(err)
	}
	if err := c.CopyDtoD(base+64, base, 32, s); err != nil {
		t.Fatal(err)
	}
	if err := c.SyncStream(s); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 32)
	if err := c.CopyDtoH(got, base+64, 0); err != nil || binary.LittleEndian.Uint32(got[28:]) != 0x01020304 {
		t.Fatalf("memset then copy: % x, %v", got, err)
	}
	sum, err := c.(gpu.Checksummer).Checksum(base, size)
	all := make([]byte, size)
	c.CopyDtoH(all, base, 0)
	if err != nil || sum != gpu.Checksum(all) {
		t.Fatalf("checksum %#x, %v; want %#x", sum, err, gpu.Checksum(all))
	}
	vadd(t, c, base)
	occupancyAgrees(t, c)
	if err := c.DestroyStream(s); err != nil {
		t.Fatal(err)
	}
	if err := c.Free(base + 4096); !errors.Is(err, abi.StatusInvalidValue) {
		t.Fatalf("free of no allocation: %v, want invalid value", err)
	}
	pid := be.Workers()[0].Pid
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if len(be.Workers()) != 0 {
		t.Fatalf("workers after close: %v", be.Workers())
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("worker %d after its context closed: %v, want reaped", pid, err)
	}
	if err := c.Sync(); err == nil {
		t.Fatal("a call on a closed context succeeded")
	}
}

// occupancyAgrees checks c answers an occupancy question about vadd as
// the software GPU does in-process.
func occupancyAgrees(t *testing.T, c gpu.Context) {
	t.Helper()
	local := newContext(t, sim.New(1<<30), 1<<40)
	defer local.Close()
	q := &abi.Occupancy{Kind: abi.OccupancyBlocks, Block: abi.Dim3{X: 96, Y: 1, Z: 1}, SharedBytes: 1 << 10}
	want, err := local.(gpu.OccupancyCalculator).Occupancy(loadKernel(t, local, "vadd"), q)
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.(gpu.OccupancyCalculator).Occupancy(loadKernel(t, c, "vadd"), q)
	if err != nil || got != want || got <= 0 {
		t.Fatalf("occupancy through the worker %d, %v; in-process %d", got, err, want)
	}
}

// vadd adds two vectors at base with the library's kernel and checks the
// sum.
func vadd(t testing.TB, c gpu.Context, base uint64) {
	t.Helper()
	const n = 256
	a, b := make([]byte, 4*n), make([]byte, 4*n)
	for i := range n {
		binary.LittleEndian.PutUint32(a[4*i:], uint32(i))
		binary.LittleEndian.PutUint32(b[4*i:], uint32(1000*i))
	}
	c.CopyHtoD(base, a, 0)
	c.CopyHtoD(base+4*n, b, 0)
	f := loadKernel(t, c, "vadd")
	cfg := gpu.LaunchConfig{Grid: abi.Dim3{X: n / 64, Y: 1, Z: 1}, Block: abi.Dim3{X: 64, Y: 1, Z: 1}}
	args := []abi.Arg{abi.Ptr(base), abi.Ptr(base + 4*n), abi.Ptr(base + 8*n), abi.U32(n)}
	if err := c.Launch(f, cfg, args, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Sync(); err != nil {
		t.Fatal(err)
	}
	out := make([]byte, 4*n)
	if err := c.CopyDtoH(out, base+8*n, 0); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if v := binary.LittleEndian.Uint32(out[4*i:]); v != uint32(1001*i) {
			t.Fatalf("vadd[%d] = %d, want %d", i, v, 1001*i)
		}
	}
}

// chase writes a one-node list at addr whose next pointer is next and
// runs pointer_chase two steps from it, into out.
func chase(t testing.TB, c gpu.Context, f gpu.Function, addr, next, out uint64) error {
	t.Helper()
	node := make([]byte, 16)
	binary.LittleEndian.PutUint64(node, next)
	binary.LittleEndian.PutUint64(node[8:], 7)
	if err := c.CopyHtoD(addr, node, 0); err != nil {
		t.Fatal(err)
	}
	one := abi.Dim3{X: 1, Y: 1, Z: 1}
	return c.Launch(f, gpu.LaunchConfig{Grid: one, Block: one}, []abi.Arg{abi.Ptr(addr), abi.U32(2), abi.Ptr(out)}, 0)
}

// TestWorkersIsolated: two contexts run in two processes, and a kernel of
// one that follows a pointer into the other's allocation faults in its
// own worker; the other's memory is untouched.
func TestWorkersIsolated(t *testing.T) {
	be := simWorkers(t)
	const a, b = 1 << 40, 1<<40 + 1<<30
	ca, cb := newContext(t, be, a), newContext(t, be, b)
	for _, x := range []struct {
		c    gpu.Context
		base uint64
	}{{ca, a}, {cb, b}} {
		if err := x.c.Alloc(x.base, 1<<20); err != nil {
			t.Fatal(err)
		}
	}
	if w := be.Workers(); len(w) != 2 || w[0].Pid == w[1].Pid {
		t.Fatalf("workers %+v, want two processes", w)
	}
	secret := pattern(4096, 99)
	cb.CopyHtoD(b, secret, 0)
	f := loadKernel(t, ca, "pointer_chase")
	if err := chase(t, ca, f, a, a, a+4096); err != nil { // its own memory: fine
		t.Fatal(err)
	}
	err := chase(t, ca, f, a, b, a+4096)
	if !errors.Is(err, abi.StatusLaunchFailed) || !strings.Contains(err.Error(), "not inside any allocation") {
		t.Fatalf("a kernel following a pointer into another context: %v, want launch failed", err)
	}
	got := make([]byte, 4096)
	if err := cb.CopyDtoH(got, b, 0); err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("the other context after the fault: %v", err)
	}
	if err := ca.CopyDtoH(got, b, 0); !errors.Is(err, abi.StatusOutOfRange) {
		t.Fatalf("a copy from another context's memory: %v, want out of range", err)
	}
}

// TestWorkerKilled: a SIGKILLed worker fails its context's next call,
// and every later one, with a launch failure that says so; the other
// context carries on and a new one is served.
func TestWorkerKilled(t *testing.T) {
	be := simWorkers(t)
	const a, b = 1 << 40, 1<<40 + 1<<30
	ca, cb := newContext(t, be, a), newContext(t, be, b)
	ca.Alloc(a, 1<<20)
	cb.Alloc(b, 1<<20)
	var pid int
	for _, w := range be.Workers() {
		if w.WindowBase == a {
			pid = w.Pid
		}
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		err := ca.CopyHtoD(a, []byte{1}, 0)
		if !errors.Is(err, abi.StatusLaunchFailed) || !strings.Contains(err.Error(), "signal: killed") {
			t.Fatalf("a call after the worker was killed: %v, want launch failed saying it was killed", err)
		}
	}
	if err := cb.CopyHtoD(b, []byte{1}, 0); err != nil {
		t.Fatalf("the other context: %v", err)
	}
	if len(be.Workers()) != 1 {
		t.Fatalf("workers %+v, want the live one", be.Workers())
	}
	if err := ca.Close(); err != nil {
		t.Fatalf("closing the dead context: %v", err)
	}
	cc := newContext(t, be, a)
	if err := cc.Alloc(a, 4096); err != nil {
		t.Fatalf("a new context after a worker died: %v", err)
	}
	cc.Close()
	cb.Close()
}

// TestSpareKilled: a spare worker that died before a session took it is
// replaced, unseen by the session.
func TestSpareKilled(t *testing.T) {
	be := simWorkers(t)
	c := newContext(t, be, 1<<40) // takes the first spare, starts another
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	var spare int
	for spare == 0 && time.Now().Before(deadline) {
		spare = spareWorker(t, be)
		time.Sleep(10 * time.Millisecond)
	}
	if spare == 0 {
		t.Fatal("no spare worker started")
	}
	syscall.Kill(spare, syscall.SIGKILL)
	time.Sleep(50 * time.Millisecond)
	c2, err := be.NewContext(1<<40+1<<30, 1<<30)
	if err != nil {
		t.Fatalf("a context after its spare died: %v", err)
	}
	c2.Close()
}

// spareWorker is a child process of this test's that no context holds:
// a spare worker.
func spareWorker(t testing.TB, be *worker.Backend) int {
	held := map[int]bool{}
	for _, w := range be.Workers() {
		held[w.Pid] = true
	}
	for _, pid := range childrenOf(os.Getpid()) {
		if !held[pid] && !zombie(pid) {
			return pid
		}
	}
	return 0
}

// TestPipelinedLaunches: once launches are pipelined the worker answers
// none; a refused one fails the next Sync, once, and the calls between
// run.
// Batched (gpu.LaunchBatcher), the launches held go first, in order, with
// the next call that is not one.
func TestPipelinedLaunches(t *testing.T) {
	t.Run("one write each", func(t *testing.T) { testPipelinedLaunches(t, false) })
	t.Run("batched", func(t *testing.T) { testPipelinedLaunches(t, true) })
}

func testPipelinedLaunches(t *testing.T, batch bool) {
	be := startWorkers(t, worker.Config{Spec: simSpec})
	const base = 1 << 40
	c := newContext(t, be, base)
	defer c.Close()
	p, ok := c.(gpu.LaunchPipeliner)
	if !ok {
		t.Fatal("the context of a pipelining backend does not pipeline")
	}
	p.PipelineLaunches()
	if b, ok := c.(gpu.LaunchBatcher); !ok {
		t.Fatal("a pipelined worker context does not batch launches")
	} else if batch {
		b.BatchLaunches()
		defer func() {
			if err := b.Flush(); err != nil {
				t.Errorf("flush: %v", err)
			}
		}()
	}
	c.Alloc(base, 1<<20)
	f := loadKernel(t, c, "pointer_chase")
	if err := chase(t, c, f, base, 1<<20, base+4096); err != nil {
		t.Fatalf("a pipelined launch answered %v, want nothing until the next sync", err)
	}
	if err := c.CopyHtoD(base+8192, []byte{1, 2, 3}, 0); err != nil {
		t.Fatalf("a call after a refused pipelined launch: %v", err)
	}
	if err := c.Sync(); !errors.Is(err, abi.StatusLaunchFailed) {
		t.Fatalf("sync after a refused pipelined launch: %v, want launch failed", err)
	}
	if err := c.Sync(); err != nil {
		t.Fatalf("a second sync: %v, want the failure reported once", err)
	}
	vadd(t, c, base)
	accumulate(t, c, base, 500) // more launches than one batch holds
}

// accumulate launches vadd k times over the 256 words at base, each
// adding the next 256 to them in place, and checks the sums: each launch
// reads the one before's result, so order matters.
func accumulate(t *testing.T, c gpu.Context, base uint64, k int) {
	t.Helper()
	const n = 256
	a, b := make([]byte, 4*n), make([]byte, 4*n)
	for i := range n {
		binary.LittleEndian.PutUint32(a[4*i:], uint32(i))
		binary.LittleEndian.PutUint32(b[4*i:], uint32(3*i+1))
	}
	c.CopyHtoD(base, a, 0)
	c.CopyHtoD(base+4*n, b, 0)
	f := loadKernel(t, c, "vadd")
	cfg := gpu.LaunchConfig{Grid: abi.Dim3{X: n / 64, Y: 1, Z: 1}, Block: abi.Dim3{X: 64, Y: 1, Z: 1}}
	args := []abi.Arg{abi.Ptr(base), abi.Ptr(base + 4*n), abi.Ptr(base), abi.U32(n)}
	for range k {
		if err := c.Launch(f, cfg, args, 0); err != nil {
			t.Fatal(err)
		}
	}
	out := make([]byte, 4*n)
	if err := c.CopyDtoH(out, base, 0); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if v, want := binary.LittleEndian.Uint32(out[4*i:]), uint32(i+k*(3*i+1)); v != want {
			t.Fatalf("after %d launches, word %d = %d, want %d", k, i, v, want)
		}
	}
}

// TestWorkersDieWithNode: a node's workers, spares included, die when the
// node is SIGKILLed (their parent-death signal; their sockets' end).
func TestWorkersDieWithNode(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), nodeEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { // the node, whatever the test found (it runs until killed)
		cmd.Process.Kill()
		cmd.Wait()
	}()
	line, _ := bufio.NewReader(out).ReadString('\n')
	var pid int
	if _, err := fmt.Sscanf(line, "worker %d", &pid); err != nil {
		t.Fatalf("the node said %q", line)
	}
	children := childrenOf(cmd.Process.Pid)
	for start := time.Now(); len(children) < 2 && time.Since(start) < 10*time.Second; { // the spare starts in the background
		time.Sleep(10 * time.Millisecond)
		children = childrenOf(cmd.Process.Pid)
	}
	if len(children) < 2 || !slices.Contains(children, pid) {
		t.Fatalf("the node's children %v, want its context's worker %d and a spare", children, pid)
	}
	cmd.Process.Kill()
	cmd.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for _, c := range children {
		for syscall.Kill(c, 0) == nil && !zombie(c) {
			if time.Now().After(deadline) {
				t.Fatalf("worker %d outlived its node", c)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// childrenOf lists the processes whose parent is pid.
func childrenOf(pid int) []int {
	var out []int
	procs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range procs {
		if f := statFields(p); len(f) > 1 && f[1] == strconv.Itoa(pid) {
			n, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			out = append(out, n)
		}
	}
	return out
}

// statFields are a /proc/PID/stat file's fields after the command: state,
// parent, ...
func statFields(path string) []string {
	stat, err := os.ReadFile(path)
	i := bytes.LastIndexByte(stat, ')')
	if err != nil || i < 0 {
		return nil
	}
	return strings.Fields(string(stat[i+1:]))
}

// zombie reports whether pid has exited and waits to be reaped (by init,
// once its parent is gone).
func zombie(pid int) bool {
	f := statFields("/proc/" + strconv.Itoa(pid) + "/stat")
	return len(f) == 0 || f[0] == "Z"
}

// TestWorkerCannotOpen: a worker that cannot open its GPU fails New with
// its reason.
func TestWorkerCannotOpen(t *testing.T) {
	_, err := worker.New(worker.Config{Spec: `{"Name":"nonsense","OneContext":true}`})
	if err == nil || !strings.Contains(err.Error(), `unknown backend "nonsense"`) {
		t.Fatalf("New with a spec naming no backend: %v", err)
	}
}

// TestLargeImageInWorker: a 40 MiB fatbin (an uploaded image's size, past
// one guest request) loads in a worker, and its function's parameter
// slots are the software GPU's own.
func TestLargeImageInWorker(t *testing.T) {
	k, _ := kernels.Lookup("vadd")
	le := binary.LittleEndian
	entry := func(b []byte, kind uint16, payload []byte) []byte {
		hdr := make([]byte, 64)
		le.PutUint16(hdr, kind)
		le.PutUint16(hdr[2:], 0x0101)
		le.PutUint32(hdr[4:], 64)
		le.PutUint64(hdr[8:], uint64(len(payload)))
		return append(append(b, hdr...), payload...)
	}
	ptx := make([]byte, (len(k.PTX)+1+7)&^7)
	copy(ptx, k.PTX)
	fat := make([]byte, 16)
	le.PutUint32(fat, abi.FatbinMagic)
	le.PutUint16(fat[4:], 1)
	le.PutUint16(fat[6:], 16)
	fat = entry(entry(fat, abi.FatbinPTX, ptx), abi.FatbinCubin, pattern(40<<20, 3)) // code for another GPU
	le.PutUint64(fat[8:], uint64(len(fat)-16))
	img := &abi.ModuleImage{Format: abi.FormatFatbin, Raw: fat}

	slots := func(c gpu.Context) []abi.ParamSlot {
		m, err := c.LoadModule(img)
		if err != nil {
			t.Fatal(err)
		}
		f, err := c.Function(m, "vadd")
		if err != nil {
			t.Fatal(err)
		}
		s, err := c.(gpu.FunctionDescriber).ParamSlots(f)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	local := newContext(t, sim.New(1<<30), 1<<40)
	defer local.Close()
	c := newContext(t, simWorkers(t), 1<<40)
	defer c.Close()
	if got, want := slots(c), slots(local); !slices.Equal(got, want) || len(got) != 4 {
		t.Fatalf("vadd's slots through a worker %v, in-process %v", got, want)
	}
}

// TestSessionsTakeReadySpares: a new context takes a spare whose worker
// has opened its GPU, never one still opening: with two spares ready and
// every worker started after them held opening, a second context is
// made once the worker started for the first is held. (The node used to
// hand the second context that worker.)
func TestSessionsTakeReadySpares(t *testing.T) {
	dir := t.TempDir()
	gate := filepath.Join(dir, "open")
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	be := startWorkers(t, worker.Config{Spec: gatedSpec + dir, Spares: 2})
	t.Cleanup(func() { os.WriteFile(gate, nil, 0o600) }) // before be closes: the held workers end
	for i := 0; func() bool { r, _ := be.Spares(); return r < 2 }(); i++ {
		if i == 3000 {
			t.Fatal("fewer than 2 spares ready after 30 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := os.Remove(gate); err != nil {
		t.Fatal(err)
	}
	if _, err := be.NewContext(1<<40, 1<<30); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ { // the worker started for the one taken is held
		if held, _ := filepath.Glob(filepath.Join(dir, "held.*")); len(held) > 0 {
			break
		}
		if i == 3000 {
			t.Fatal("no worker started for the spare taken after 30 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	made := make(chan error, 1)
	go func() {
		_, err := be.NewContext(2<<40, 1<<30)
		made <- err
	}()
	select {
	case err := <-made:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second): // only a worker held opening never answers
		t.Fatal("a new context waits for a worker still opening its GPU while a spare is ready")
	}
}

// TestRefillsAFewAtATime: while contexts run, spares taken are refilled
// by at most two workers opening the GPU at once (a context being made
// holds driver locks the running ones wait for); once those opened, the
// rest follow, until every spare is back.
func TestRefillsAFewAtATime(t *testing.T) {
	const spares, taken, atOnce = 6, 5, 2
	dir := t.TempDir()
	gate := filepath.Join(dir, "open")
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	be := startWorkers(t, worker.Config{Spec: gatedSpec + dir, Spares: spares})
	t.Cleanup(func() { os.WriteFile(gate, nil, 0o600) })
	waitSpares := func(n int) {
		for i := 0; func() bool { r, _ := be.Spares(); return r < n }(); i++ {
			if i == 3000 {
				r, _ := be.Spares()
				t.Fatalf("%d spares ready after 30 s, want %d", r, n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitSpares(spares)
	if err := os.Remove(gate); err != nil {
		t.Fatal(err)
	}
	for i := range taken {
		c, err := be.NewContext(uint64(i+1)<<40, 1<<30)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	opening := func() int { held, _ := filepath.Glob(filepath.Join(dir, "held.*")); return len(held) }
	for i := 0; opening() < atOnce; i++ {
		if i == 3000 {
			t.Fatalf("%d workers opening the GPU after 30 s, want %d", opening(), atOnce)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // time for more to start, were any to
	if n := opening(); n != atOnce {
		t.Fatalf("%d workers opening the GPU at once with %d contexts running, want %d", n, taken, atOnce)
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitSpares(spares)
}

// TestWorkerLayoutNotRandomised: a worker runs with address-space
// randomisation off (personality ADDR_NO_RANDOMIZE), so the GPU driver's
// regions, and the module variables in them, lie at the same addresses in
// a primary's worker and in its replica's, and with one malloc arena (glibc
// maps 64 MiB more for each other, as threads' timing asks). Skipped where this machine
// refuses the personality (setarch -R fails too).
func TestWorkerLayoutNotRandomised(t *testing.T) {
	if err := exec.Command("setarch", "-R", "true").Run(); err != nil {
		t.Skipf("this machine refuses ADDR_NO_RANDOMIZE (setarch -R: %v)", err)
	}
	be := simWorkers(t)
	const base = 1 << 40
	c := newContext(t, be, base)
	defer c.Close()
	for _, w := range be.Workers() {
		if w.WindowBase != base {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/personality", w.Pid))
		if err != nil {
			t.Fatal(err)
		}
		p, err := strconv.ParseUint(strings.TrimSpace(string(b)), 16, 32)
		if err != nil || p&0x0040000 == 0 {
			t.Fatalf("worker %d's personality %q (%v): want ADDR_NO_RANDOMIZE (0x0040000)", w.Pid, b, err)
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", w.Pid))
		if err != nil || !slices.Contains(strings.Split(string(env), "\x00"), "MALLOC_ARENA_MAX=1") {
			t.Fatalf("worker %d's environment lacks MALLOC_ARENA_MAX=1 (%v)", w.Pid, err)
		}
		return
	}
	t.Fatalf("no worker holds the window at %#x: %+v", uint64(base), be.Workers())
}
