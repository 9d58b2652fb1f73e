// Package worker is a gpu.Backend whose every context lives in a process
// of its own: a worker, this binary run again (RunIfAsked), which opens
// the real backend (cuda or sim) and serves exactly one context. The node
// keeps everything else (sessions, validation, exactly-once, the log, the
// handle tables); only a session's GPU work crosses to its worker.
//
// Why a process: contexts of one process share its GPU address space and
// its CUDA state, so a guest's own kernel could read every other session's
// memory, and one faulting kernel ends CUDA in the process for everyone.
// A worker's kernel reaches its own process's memory only, and a fault, or
// the worker's death, fails that session's calls with
// abi.StatusLaunchFailed (CUDA's sticky launch failure) and nothing else:
// the node stays healthy and the next session gets a new worker.
//
// The wire (protocol.go) is a socketpair: one request at a time, answered
// in order, plus a memfd both map for bytes past inlineMax (BenchmarkHop
// shows where the shared memory wins). A worker's context pipelines
// launches (gpu.LaunchPipeliner), whatever the backend: they go
// unanswered, and a launch the child's backend refused is reported by the
// context's next Sync or SyncStream, as CUDA reports an asynchronous
// launch's failure. The child runs each launch as it reads it, without a
// real context's launcher thread (which spins after each launch: a core
// per worker). Batched (gpu.LaunchBatcher), the parent holds launches
// back until its next call that is not one, 32 KiB of them, or a Flush
// (the session's Idle), so many launches cost one write and one wake-up
// of the worker. The optional interfaces a proxy carries are the backend's
// description (gpu.DeviceDescriber, SharedMemoryLimiter, AccessChecker),
// launch pipelining, function descriptions, module variables, tensor maps,
// occupancy and checksums; a snapshot for a resync, prefaulting, queued
// copies and the device's live status (gpu.DeviceStatusReporter) are not
// carried (a resync then copies with its guest stopped, a standby copies
// in place, a guest's NVML shows memory only).
//
// A worker inherits only its socket and the shared memory; it ignores the
// signals meant for the node's group (the node ends it by closing its
// socket), dies with the node (PR_SET_PDEATHSIG, from a thread that lives
// as long as the backend) and is reaped by it. Workers are started ahead
// (Config.Spares), so a session need not wait for a process and its
// backend to open; while sessions run, two at a time (toStart), since a
// context being made holds driver locks the running ones wait for. On
// the software GPU each worker has its own memory limit (the spec's),
// where one process's contexts share one.
//
// Choices, and why. A worker runs /proc/self/exe, the node's binary as
// it runs: the file an upgrade put in its place may speak another
// protocol. The parent decides where each copy's bytes travel (flagShm,
// both ways), so one constant sets the threshold. A spare worker has its
// backend open and, on CUDA, its one context made (cuda's
// MakeContextAhead), so it is a spare context in a process. The agent runs
// workers by default only for guests' own kernels (--guest.workers auto):
// the library's kernels have every pointer argument checked, so sessions
// that run only those stay in the node's process and skip the hop, a
// round trip between processes per call (BenchmarkHop).
//
// A node serving several GPUs has one Backend per GPU (gpu.Set), each
// of whose Config.Spec names that GPU: a session's worker opens the GPU
// the hypervisor placed the session on.
//
// The package must never decide anything about a session: it carries
// calls, and a failure it sees is the call's.
package worker

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// DefaultSharedBytes is a worker's shared memory unless Config says: the
// most bytes one piece of a large copy moves.
const DefaultSharedBytes = 8 << 20

// Config says how a Backend starts its workers.
type Config struct {
	// Spec is handed, as is, to the open function of the worker's
	// RunIfAsked: it names the real backend to open.
	Spec string
	// Path is the binary run as a worker; empty: this process's own, as
	// it runs (/proc/self/exe: the binary an upgrade put in its place
	// might speak another protocol).
	Path string
	// Spares is how many workers are kept started ahead.
	Spares int
	// SharedBytes is each worker's shared memory (at least inlineMax);
	// zero: DefaultSharedBytes.
	SharedBytes int
}

// Backend is a gpu.Backend whose contexts run in worker processes.
type Backend struct {
	cfg   Config
	sp    *spawner
	name  string
	caps  uint32
	optIn uint32
	info  abi.DeviceInfoReply

	mu sync.Mutex
	// spares are started workers that have opened the GPU; starting
	// counts those on their way (fill), opening those of them running.
	spares   []*process
	starting int
	opening  map[*process]struct{}
	live     map[*proxy]struct{}
	closed   bool
}

// New starts a first worker, which describes the real backend (a worker
// that cannot open it fails New with why), and keeps it as a spare.
func New(cfg Config) (*Backend, error) {
	if cfg.SharedBytes == 0 {
		cfg.SharedBytes = DefaultSharedBytes
	}
	if cfg.SharedBytes < inlineMax || cfg.SharedBytes > 1<<30 {
		return nil, fmt.Errorf("a GPU worker's shared memory of %d bytes: want %d to 1 GiB", cfg.SharedBytes, inlineMax)
	}
	if cfg.Path == "" {
		cfg.Path = "/proc/self/exe"
	}
	b := &Backend{cfg: cfg, sp: newSpawner(), live: map[*proxy]struct{}{}, opening: map[*process]struct{}{}}
	proc, err := b.sp.start(cfg.Path, cfg.Spec, cfg.SharedBytes)
	if err != nil {
		b.sp.stop()
		return nil, err
	}
	if err := b.describe(proc); err != nil {
		proc.kill()
		b.sp.stop()
		return nil, fmt.Errorf("opening the GPU in a worker: %w", err)
	}
	b.spares = append(b.spares, proc)
	b.fill()
	return b, nil
}

// describe asks a fresh worker what its backend is.
func (b *Backend) describe(proc *process) error {
	l := link{w: proc.conn, r: proc.r, shm: proc.shm}
	d, err := l.ask(opDescribe)
	if err != nil {
		return err
	}
	b.name = d.String(256)
	b.caps, b.optIn = d.U32(), d.U32()
	info := d.Bytes(maxReply)
	if err := finish(d); err != nil || b.caps&capDeviceInfo == 0 {
		return err
	}
	if err := abi.Unmarshal(info, &b.info); err != nil {
		return fmt.Errorf("%w: device description: %w", errProtocol, err)
	}
	return nil
}

// Name implements gpu.Backend: the real backend's.
func (b *Backend) Name() string { return b.name }

// IsolatesContexts implements gpu.ProcessIsolator.
func (b *Backend) IsolatesContexts() bool { return true }

// ChecksEveryAccess implements gpu.AccessChecker as the real backend does.
func (b *Backend) ChecksEveryAccess() bool { return b.caps&capAccessChecker != 0 }

// MaxSharedBytesOptIn implements gpu.SharedMemoryLimiter as the real
// backend does (zero where it does not say).
func (b *Backend) MaxSharedBytesOptIn() uint32 { return b.optIn }

// DeviceInfo implements gpu.DeviceDescriber: the first worker's answer.
func (b *Backend) DeviceInfo() (abi.DeviceInfoReply, error) {
	if b.caps&capDeviceInfo == 0 {
		return abi.DeviceInfoReply{}, fmt.Errorf("%w: the %s backend does not describe its device", abi.StatusNotSupported, b.name)
	}
	return b.info, nil
}

// NewContext implements gpu.Backend: a spare worker (or a new one) makes
// the context. A spare that died meanwhile is replaced once.
func (b *Backend) NewContext(base, size uint64) (gpu.Context, error) {
	for attempt := 0; ; attempt++ {
		proc, err := b.take()
		if err != nil {
			return nil, err
		}
		ctx, err := b.open(proc, base, size)
		var ce *childError
		if err == nil || errors.As(err, &ce) || attempt > 0 {
			return ctx, err
		}
	}
}

// take returns a spare worker, or starts one.
func (b *Backend) take() (*process, error) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, fmt.Errorf("%w: the GPU backend is closed", abi.StatusUnavailable)
	}
	var proc *process
	if n := len(b.spares); n > 0 {
		proc, b.spares = b.spares[n-1], b.spares[:n-1]
	}
	b.mu.Unlock()
	b.fill()
	if proc != nil {
		return proc, nil
	}
	return b.sp.start(b.cfg.Path, b.cfg.Spec, b.cfg.SharedBytes)
}

// fill starts, in the background, workers for the spares lacking,
// counting those starting (toStart says how many at once). Each becomes
// a spare only once it has opened the GPU, so a session never takes a
// worker still opening while one that is ready waits: opening takes a
// worker 2-3 s on an H200 host, 10-20 s while 16 open at once, and the
// node used to hand each new session the worker started last, for the
// one it took.
func (b *Backend) fill() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	n := toStart(b.cfg.Spares, len(b.spares), b.starting, len(b.live))
	b.starting += n
	for range n {
		go b.startSpare()
	}
}

// refillAtOnce is how many workers open the GPU at once while sessions
// run. Opening a context holds the driver's locks that the running
// contexts' calls wait for: with sixteen guests training on an H200 and
// sixteen spares refilling at once, the guests' allocations waited 10 s
// in all, and the workers opening sat in uninterruptible sleep.
const refillAtOnce = 2

// toStart is how many spare workers to start now, of want kept, with
// ready spares, starting on their way and live contexts: every one
// lacking while no context runs (nothing to disturb), refillAtOnce at
// most on their way once one does.
func toStart(want, ready, starting, live int) int {
	n := want - ready - starting
	if live > 0 {
		n = min(n, refillAtOnce-starting)
	}
	return max(n, 0)
}

// startSpare starts a worker and keeps it as a spare once it has opened
// the GPU (a worker answers only then: it describes its backend). One
// that fails is dropped; the next session taken starts another.
func (b *Backend) startSpare() {
	proc, err := b.sp.start(b.cfg.Path, b.cfg.Spec, b.cfg.SharedBytes)
	if err == nil {
		b.mu.Lock()
		if b.closed {
			err = errors.New("the backend closed")
		} else {
			b.opening[proc] = struct{}{} // Close ends it, and the describe with it
		}
		b.mu.Unlock()
	}
	if err == nil {
		_, err = (&link{w: proc.conn, r: proc.r, shm: proc.shm}).ask(opDescribe)
	}
	b.mu.Lock()
	delete(b.opening, proc)
	b.starting--
	keep := err == nil && !b.closed
	if keep {
		b.spares = append(b.spares, proc)
	}
	b.mu.Unlock()
	if !keep && proc != nil {
		proc.kill()
	}
	if keep {
		b.fill() // the next, where refills go a few at a time (a failed one waits for the next take)
	}
}

// Spares implements gpu.SpareReporter: workers that have opened the GPU,
// of Config.Spares.
func (b *Backend) Spares() (ready, kept int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.spares), b.cfg.Spares
}

// open has proc make the context.
func (b *Backend) open(proc *process, base, size uint64) (gpu.Context, error) {
	p := &proxy{be: b, proc: proc, link: link{w: proc.conn, r: proc.r, shm: proc.shm}}
	d, err := p.ask(opNewContext, base, size)
	if err != nil {
		p.die(err)
		return nil, err
	}
	p.base, p.size = d.U64(), d.U64()
	caps := d.U32()
	if err := p.done(d); err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.live[p] = struct{}{}
	b.mu.Unlock()
	if caps&capPipeline != 0 {
		return pipelined{p}, nil
	}
	return p, nil
}

// forget drops a context whose worker is gone.
func (b *Backend) forget(p *proxy) {
	if b == nil {
		return
	}
	b.mu.Lock()
	delete(b.live, p)
	b.mu.Unlock()
}

// Worker is one context's worker process.
type Worker struct {
	Pid              int
	WindowBase, Size uint64 // the context's window
}

// Workers lists the live contexts' workers.
func (b *Backend) Workers() []Worker {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []Worker
	for p := range b.live {
		out = append(out, Worker{Pid: p.proc.pid, WindowBase: p.base, Size: p.size})
	}
	return out
}

// Close implements gpu.Backend: spares end, and any worker whose context
// was not closed is killed.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	spares, live, opening := b.spares, b.live, b.opening
	b.spares, b.live, b.opening = nil, map[*proxy]struct{}{}, map[*process]struct{}{}
	b.mu.Unlock()
	for proc := range opening {
		proc.signalKill() // its describe fails, and startSpare reaps it
	}
	for _, proc := range spares {
		proc.end(5 * time.Second)
	}
	for p := range live {
		p.proc.signalKill() // its context's next call finds it gone
	}
	b.sp.stop()
	return nil
}
