package hypervisor_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/cuda"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/internal/lab/workload"
	"github.com/vgpuha/vgpuha/kernels"
	"github.com/vgpuha/vgpuha/mmiotrace"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/pvdriver/transport"
	"github.com/vgpuha/vgpuha/pvdriver/transport/shm"
)

// startShm serves guests on a shm+unix socket (shared memory and plain
// unix on the same path), on the software GPU.
func startShm(t testing.TB, cfg ...hypervisor.Config) (*env, string) {
	t.Helper()
	b := sim.New(1 << 30)
	e, sock := startShmOn(t, b, cfg...)
	e.backend = b
	return e, sock
}

// startShmOn is startShm on any backend.
func startShmOn(t testing.TB, backend gpu.Backend, cfg ...hypervisor.Config) (*env, string) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("shared memory needs Linux")
	}
	e := &env{reg: prometheus.NewRegistry()}
	c := hypervisor.DefaultConfig()
	if len(cfg) > 0 {
		c = cfg[0]
	}
	srv, err := hypervisor.NewServer(backend, c, e.reg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "g.sock")
	ln, err := transport.Listen("shm+unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	e.srv, e.endpoint = srv, "shm+unix://"+sock
	return e, sock
}

func TestWorkloadsOverShm(t *testing.T) {
	e, _ := startShm(t)
	c := e.client(t, "g")
	ws, _ := workload.Select("all")
	for _, w := range ws {
		r, err := w.Run(context.Background(), c, 0)
		if err != nil {
			t.Fatal(err)
		}
		if !r.Verified {
			t.Errorf("%s: wrong result: %s", r.Name, r.Detail)
		}
	}
}

// TestScribblingGuestLosesOnlyItsSession: one guest's rings and bytes are
// overwritten with random bytes by a concurrent goroutine while it makes
// calls; the node never crashes, and guests beside it (over shared memory
// and over a plain unix socket) keep getting right answers.
func TestScribblingGuestLosesOnlyItsSession(t *testing.T) {
	e, sock := startShm(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := shm.Dial(ctx, sock, shm.Options{RequestRing: shm.MinRing, ReplyRing: shm.MinRing})
	if err != nil {
		t.Fatal(err)
	}
	// The client may close its connection when it breaks; the area stays
	// mapped until the scribbler has stopped (below), or the scribbler
	// would fault on its own unmapped memory.
	bad, err := pvdriver.NewClient(keepMapped{conn}, pvdriver.Options{GuestName: "scribbler"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	defer bad.Close()
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() { // the hostile guest's other thread
		defer close(stopped)
		area, r := conn.SharedMemory(), rand.New(rand.NewPCG(7, 7))
		for {
			select {
			case <-stop:
				return
			default:
			}
			for range 64 {
				area[r.IntN(len(area))] = byte(r.Uint32())
			}
			runtime.Gosched()
		}
	}()
	go func() { // and its calls, whatever becomes of them
		p, err := bad.Alloc(1 << 20)
		buf := make([]byte, 100<<10)
		for err == nil {
			if err = bad.CopyHtoD(p, buf); err == nil {
				err = bad.CopyDtoH(buf, p)
			}
		}
	}()
	viaShm := e.client(t, "neighbour-shm")
	e.endpoint = "unix://" + sock
	viaUnix := e.client(t, "neighbour-unix")
	for _, c := range []*pvdriver.Client{viaShm, viaUnix} {
		p := mustAlloc(t, c, 1<<20, 0)
		want := bytes.Repeat([]byte{0x5a, 0xa5, 3}, 300<<10/3)
		got := make([]byte, len(want))
		for range 30 {
			if err := c.CopyHtoD(p, want); err != nil {
				t.Fatal(err)
			}
			if err := c.CopyDtoH(got, p); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatal("a neighbour's data changed")
			}
		}
	}
	close(stop)
	<-stopped
	conn.Close()
	// The node still opens sessions.
	e.endpoint = "shm+unix://" + sock
	if _, err := e.client(t, "after").Alloc(4096); err != nil {
		t.Fatal(err)
	}
}

// keepMapped is a connection whose Close is left to the test.
type keepMapped struct{ *shm.Conn }

func (keepMapped) Close() error { return nil }

// registering is the software GPU with page-locking counted.
type registering struct {
	*sim.Backend
	registered, unregistered atomic.Int64 // bytes
}

func (r *registering) RegisterHost(mem []byte) (func() error, error) {
	r.registered.Add(int64(len(mem)))
	return func() error { r.unregistered.Add(int64(len(mem))); return nil }, nil
}

// TestSharedAreaRegistered: a backend that page-locks host memory gets a
// shared-memory guest's whole area and its host-memory region for the
// connection's life.
func TestSharedAreaRegistered(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("shared memory needs Linux")
	}
	b := &registering{Backend: sim.New(1 << 30)}
	srv, err := hypervisor.NewServer(b, hypervisor.DefaultConfig(), prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	sock := filepath.Join(t.TempDir(), "g.sock")
	ln, err := transport.Listen("shm+unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	c, err := pvdriver.Open(context.Background(), "shm+unix://"+sock, pvdriver.Options{GuestName: "g"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Alloc(4096); err != nil {
		t.Fatal(err)
	}
	want := int64(4096 + 2*shm.DefaultRing + shm.DefaultHostMemory)
	if got := b.registered.Load(); got != want {
		t.Fatalf("registered %d bytes, want the area's and the host-memory region's %d", got, want)
	}
	c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for b.unregistered.Load() != want && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := b.unregistered.Load(); got != want {
		t.Fatalf("unregistered %d bytes after the guest left, want %d", got, want)
	}
}

// TestApertureOverShm: a guest over shared memory maps apertures as over
// a unix socket (the node finds the guest process through the socket).
func TestApertureOverShm(t *testing.T) {
	if mmiotrace.UffdAvailable() != nil {
		t.Skip("uffd mode needs Linux 6.7+")
	}
	cfg := hypervisor.DefaultConfig()
	cfg.MMIO.Mode = mmiotrace.ModeUffd
	e, _ := startShm(t, cfg)
	c := e.client(t, "self")
	a, err := c.MapAperture(4096, pvdriver.Memory)
	if err != nil {
		t.Fatal(err)
	}
	a.Mem[100] = 7
	got := make([]byte, 4096)
	if err := c.CopyDtoH(got, a.Ptr); err != nil || got[100] != 7 {
		t.Fatalf("device copy after a write: %v %d", err, got[100])
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkShmSyncCall64: one 64-byte synchronous copy over shared memory,
// beside the same copy on the backend called in-process. The two legs run
// in alternating runs of syncRun calls each, so a noisy neighbour slows
// both alike while each leg's context stays current on the device: on
// CUDA the in-process context and the node's are two contexts of one GPU,
// and a copy in the other context than the last one pays for the device
// switching between them (bench pv's rounds do the same). It reports the
// medians and means of single calls of both, their ratios (x-direct:
// shared memory's mean over the in-process one; what the paravirtual path
// costs), the mean of each run's first in-process call (direct-first-ns:
// what that switch costs), and how often a side gave up spinning and
// slept per call (each sleep costs a goroutine's wake-up). The backend is
// the software GPU, or CUDA device 0 with VGPUHA_BENCH_BACKEND=cuda.
func BenchmarkShmSyncCall64(b *testing.B) {
	backend := benchBackend(b)
	e, _ := startShmOn(b, backend)
	direct := directCopy(b, backend)
	c := e.client(b, "bench")
	p, err := c.Alloc(4096)
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 64)
	shmTook, directTook := make([]time.Duration, b.N), make([]time.Duration, b.N)
	var firstTook time.Duration
	before := shm.ReadStats()
	b.ResetTimer()
	for from := 0; from < b.N; from += syncRun {
		run := min(syncRun, b.N-from)
		timeEach(b, directTook[from:from+run], func() error { return direct(buf) })
		timeEach(b, shmTook[from:from+run], func() error { return c.CopyHtoD(p, buf) })
		firstTook += directTook[from]
	}
	b.StopTimer()
	after := shm.ReadStats()
	runs := float64((b.N + syncRun - 1) / syncRun)
	// Medians beside the means: on a machine whose cores are shared, the
	// mean is mostly the calls that found a side descheduled.
	sp50, smean := p50Mean(shmTook)
	dp50, dmean := p50Mean(directTook)
	b.ReportMetric(sp50, "shm-p50-ns")
	b.ReportMetric(smean, "shm-mean-ns")
	b.ReportMetric(dp50, "direct-p50-ns")
	b.ReportMetric(dmean, "direct-mean-ns")
	b.ReportMetric(float64(firstTook.Nanoseconds())/runs, "direct-first-ns")
	b.ReportMetric(smean/dmean, "x-direct")
	b.ReportMetric(sp50/dp50, "x-direct-p50")
	b.ReportMetric(float64(after.GuestSleeps-before.GuestSleeps)/float64(b.N), "guest-sleeps/op")
	b.ReportMetric(float64(after.NodeSleeps-before.NodeSleeps)/float64(b.N), "node-sleeps/op")
}

// syncRun is how many calls BenchmarkShmSyncCall64 makes on one leg before
// it turns to the other.
const syncRun = 256

// timeEach calls call once per element of took, timing each call.
func timeEach(b *testing.B, took []time.Duration, call func() error) {
	for i := range took {
		start := time.Now()
		if err := call(); err != nil {
			b.Fatal(err)
		}
		took[i] = time.Since(start)
	}
}

// benchBackend is the backend a benchmark measures: the software GPU, or
// CUDA device 0 when VGPUHA_BENCH_BACKEND=cuda.
func benchBackend(b *testing.B) gpu.Backend {
	switch name := os.Getenv("VGPUHA_BENCH_BACKEND"); name {
	case "", "sim":
		return sim.New(1 << 30)
	case "cuda":
		cb, err := cuda.New(0)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cb.Close() })
		return cb
	default:
		b.Fatalf("VGPUHA_BENCH_BACKEND=%s: want sim or cuda", name)
		return nil
	}
}

// directCopy returns a 64-byte synchronous host-to-device copy on a fresh
// context of backend, called in-process.
func directCopy(b *testing.B, backend gpu.Backend) func([]byte) error {
	ctx, err := backend.NewContext(0x7f0000000000, 1<<30)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ctx.Close() })
	base, _ := ctx.Window()
	if err := ctx.Alloc(base, 2<<20); err != nil {
		b.Fatal(err)
	}
	return func(p []byte) error { return ctx.CopyHtoD(base, p, 0) }
}

// p50Mean is the median and the mean of took, in nanoseconds; it sorts
// took.
func p50Mean(took []time.Duration) (p50, mean float64) {
	var sum time.Duration
	for _, d := range took {
		sum += d
	}
	slices.Sort(took)
	return float64(took[len(took)/2].Nanoseconds()), float64(sum.Nanoseconds()) / float64(len(took))
}

// BenchmarkShmLaunch: pipelined kernel launches over shared memory to the
// software GPU, one synchronization at the end (the rate a guest queues
// work at).
func BenchmarkShmLaunch(b *testing.B) {
	e, _ := startShm(b)
	c := e.client(b, "bench")
	p, err := c.Alloc(3 * 4096)
	if err != nil {
		b.Fatal(err)
	}
	img, _ := kernels.Image("vadd")
	m, err := c.LoadModule(img)
	if err != nil {
		b.Fatal(err)
	}
	f, err := c.GetFunction(m, "vadd")
	if err != nil {
		b.Fatal(err)
	}
	cfg := pvdriver.LaunchConfig{Grid: pvdriver.Dim(1), Block: pvdriver.Dim(256)}
	args := []abi.Arg{pvdriver.Ptr(p), pvdriver.Ptr(p + 4096), pvdriver.Ptr(p + 8192), pvdriver.U32(256)}
	b.ResetTimer()
	for range b.N {
		if err := c.Launch(f, cfg, args...); err != nil {
			b.Fatal(err)
		}
	}
	if err := c.Synchronize(); err != nil {
		b.Fatal(err)
	}
}

// TestConcurrentCallers: goroutines sharing one client make synchronous
// calls and pipelined ones at once, over a socket and over shared memory
// (where a caller that finds nobody reading replies reads its own and
// hands others theirs, and one that finds the turn taken waits for the
// reader). Every reply must reach its own caller, and each goroutine's
// pipelined memset must land before its next read. It also fails if two
// goroutines' frames reach the node out of id order: the node answers the
// lower id from its state as a resend, without running it.
func TestConcurrentCallers(t *testing.T) {
	t.Run("unix", func(t *testing.T) {
		concurrentCallers(t, start(t, hypervisor.DefaultConfig()))
	})
	t.Run("shm", func(t *testing.T) {
		e, _ := startShm(t)
		concurrentCallers(t, e)
	})
	// Both sides spin 1 µs at most: nearly every wait ends asleep, so a
	// lost wake-up would hang a call (caught at concurrentCallers'
	// deadline).
	t.Run("shm-sleeping", func(t *testing.T) {
		e, _ := startShm(t)
		ln, err := transport.Listen("shm+unix://" + filepath.Join(t.TempDir(), "s.sock") + "?spin=1us")
		if err != nil {
			t.Fatal(err)
		}
		go e.srv.Serve(ln)
		e.endpoint = "shm+unix://" + ln.Addr().String() + "?spin=1us"
		before := shm.ReadStats()
		concurrentCallers(t, e)
		if after := shm.ReadStats(); after.GuestSleeps == before.GuestSleeps || after.NodeSleeps == before.NodeSleeps {
			t.Fatalf("no side slept (%+v): the test did not exercise wake-ups", after)
		}
	})
}

func concurrentCallers(t *testing.T, e *env) {
	c := e.client(t, "many")
	const workers, rounds = 8, 200
	errs := make(chan error, workers)
	for w := range workers {
		go func() { errs <- shmWorker(c, uint32(w), rounds) }()
	}
	deadline := time.After(60 * time.Second)
	for range workers {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
		case <-deadline:
			t.Fatal("calls still hang after 60 s (a lost wake-up?)")
		}
	}
}

// shmWorker writes a pattern of its own, queues a memset over part of it
// and reads both back, rounds times.
func shmWorker(c *pvdriver.Client, w uint32, rounds int) error {
	p, err := c.Alloc(4096)
	if err != nil {
		return err
	}
	pattern, got := make([]byte, 256), make([]byte, 256)
	for k := range rounds {
		for i := range pattern {
			pattern[i] = byte(int(w)*31 + k + i)
		}
		if err := c.CopyHtoD(p, pattern); err != nil {
			return err
		}
		v := w<<16 | uint32(k)
		if err := c.Memset32Async(p+128, v, 32, 0); err != nil {
			return err
		}
		if err := c.CopyDtoH(got, p); err != nil {
			return err
		}
		want := bytes.Clone(pattern)
		for i := 128; i < 256; i += 4 {
			want[i], want[i+1], want[i+2], want[i+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
		}
		if !bytes.Equal(got, want) {
			return fmt.Errorf("worker %d round %d: read back %x, want %x", w, k, got, want)
		}
	}
	return nil
}

// TestCloseWhileCallingOverShm: Close from another goroutine while callers
// read their own replies off the ring ends every call at once: each
// returns (nil or ErrClosed), none hangs.
func TestCloseWhileCallingOverShm(t *testing.T) {
	e, _ := startShm(t)
	c := e.client(t, "closing")
	p, err := c.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	const workers = 4
	done := make(chan error, workers)
	for range workers {
		go func() {
			buf := make([]byte, 64)
			for {
				if err := c.CopyHtoD(p, buf); err != nil {
					done <- err
					return
				}
			}
		}()
	}
	time.Sleep(50 * time.Millisecond)
	c.Close()
	for range workers {
		select {
		case err := <-done:
			if !errors.Is(err, pvdriver.ErrClosed) {
				t.Fatalf("a call after Close: %v, want ErrClosed", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a call still hangs 10 s after Close")
		}
	}
}
