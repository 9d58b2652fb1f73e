package cuda

import (
	"encoding/binary"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Pipelined launches. A guest that queues kernels one after another keeps
// the node's connection goroutine busy with two things per launch: its own
// work (reading the frame, validating, exactly-once bookkeeping: about a
// microsecond) and the driver's (cuLaunchKernel: 3-4 µs on an H100). Done
// in turn, they made a guest's launch rate 1.2-1.4x slower than the same
// launches made in-process. With PipelineLaunches a context hands its
// launches to a thread of its own (the launcher: the context current on
// it, polling its queue a little after the last launch, then asleep), so
// the node validates the next launch while the driver takes this one.
//
// Order: every other call on the context first waits until the queue is
// empty and the launcher idle (drain, under the context's lock,
// which Launch also takes to queue), so the driver sees the context's
// calls in the order the node made them, and never from two threads at
// once. A launch the driver refuses when the launcher submits it (out of
// resources, say: validation caught everything else) fails later than
// the request: its error is kept and returned by the context's next Sync
// or SyncStream, as a GPU reports an asynchronous launch's failure, and
// the calls between run as they would have. A replica applying a log
// pipelines too (hypervisor's OpenReplica), so a launch refused on both
// nodes fails the same synchronization on both, and the calls between
// run on both: they end up with the same memory.

// launchSpin is how long the launcher polls its queue after the last
// launch before it sleeps (a guest's next launch usually comes within
// microseconds).
const launchSpin = 50 * time.Microsecond

// launcher is a context's launch thread and queue. begin runs once on
// the thread before any launch (it makes the context current there);
// submit hands one launch to the driver.
type launcher struct {
	begin   func() error
	submit  func(q *queuedLaunch) error
	mu      sync.Mutex
	idle    sync.Cond // broadcast when the queue is empty and nothing is being submitted
	queue   []queuedLaunch
	running bool
	failed  error // a submission's error not yet returned by a sync
	stop    bool
	queued  atomic.Int32  // len(queue), polled without the lock
	wake    chan struct{} // the launcher sleeps on it
	done    chan struct{} // closed when the launcher has exited
}

// queuedLaunch is a launch with its parameters copied out of the request.
type queuedLaunch struct {
	fn, stream uintptr
	cfg        gpu.LaunchConfig
	params     [][]byte
}

// PipelineLaunches implements gpu.LaunchPipeliner: from now on launches
// are submitted by the context's launcher thread.
func (c *guestContext) PipelineLaunches() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.launches != nil {
		return
	}
	d, ctx := c.d, c.ctx
	c.launches = startLauncher(
		func() error { return d.check("cuCtxSetCurrent(launcher)", d.cuCtxSetCurrent(ctx)) },
		func(q *queuedLaunch) error {
			return d.check("cuLaunchKernel", d.launchKernel(q.fn, q.cfg, q.stream, q.params))
		})
}

// startLauncher starts a launcher thread (see launcher).
func startLauncher(begin func() error, submit func(q *queuedLaunch) error) *launcher {
	l := &launcher{begin: begin, submit: submit, wake: make(chan struct{}, 1), done: make(chan struct{})}
	l.idle.L = &l.mu
	go l.run()
	return l
}

// queueLaunch resolves a launch's handles and queues it.
// Precondition: c.mu must be locked and c.launches set.
func (c *guestContext) queueLaunch(f gpu.Function, cfg gpu.LaunchConfig, args []abi.Arg, s gpu.Stream) error {
	fn, st, err := c.launchTarget(f, s)
	if err != nil {
		return err
	}
	// The request's bytes are the node's to reuse once this returns.
	c.launches.add(queuedLaunch{fn: fn, stream: st, cfg: cfg, params: launchParams(args, true)})
	return nil
}

// add queues q and wakes the launcher.
func (l *launcher) add(q queuedLaunch) {
	l.mu.Lock()
	l.queue = append(l.queue, q)
	l.queued.Store(int32(len(l.queue)))
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// launchParams lays out each parameter's value: a byte argument's own
// bytes (copied if own is set), else 8 bytes holding the scalar (zero for
// an empty byte argument).
func launchParams(args []abi.Arg, own bool) [][]byte {
	values := make([]byte, 8*len(args))
	params := make([][]byte, len(args))
	for i, a := range args {
		v := values[8*i : 8*i+8]
		switch {
		case a.Kind == abi.ArgBytes && len(a.Raw) > 0 && own:
			v = append([]byte(nil), a.Raw...)
		case a.Kind == abi.ArgBytes && len(a.Raw) > 0:
			v = a.Raw
		case a.Kind != abi.ArgBytes:
			binary.NativeEndian.PutUint64(v, a.Bits)
		}
		params[i] = v
	}
	return params
}

// run is the launcher thread: it submits queued launches in order, on
// its locked OS thread.
func (l *launcher) run() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer close(l.done)
	current := l.begin()
	var batch []queuedLaunch
	for {
		l.mu.Lock()
		for len(l.queue) == 0 && !l.stop {
			l.running = false
			l.idle.Broadcast()
			l.mu.Unlock()
			l.await()
			l.mu.Lock()
		}
		if l.stop && len(l.queue) == 0 {
			l.running = false
			l.idle.Broadcast()
			l.mu.Unlock()
			return
		}
		batch, l.queue = l.queue, batch[:0]
		l.queued.Store(0)
		l.running = true
		l.mu.Unlock()
		for i := range batch {
			err := current
			if err == nil {
				err = l.submit(&batch[i])
			}
			if err != nil {
				l.mu.Lock()
				if l.failed == nil {
					l.failed = err
				}
				l.mu.Unlock()
			}
			batch[i] = queuedLaunch{}
		}
	}
}

// await polls for a queued launch for launchSpin, then sleeps until woken.
func (l *launcher) await() {
	for start := time.Now(); time.Since(start) < launchSpin; {
		if l.queued.Load() > 0 {
			return
		}
	}
	<-l.wake
}

// drain waits until every queued launch has been submitted.
// Precondition: the context's lock must be held (nothing more is queued).
func (l *launcher) drain() {
	l.mu.Lock()
	for len(l.queue) > 0 || l.running {
		l.idle.Wait()
	}
	l.mu.Unlock()
}

// takeFailure returns, once, a queued launch's submission error.
func (l *launcher) takeFailure() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	err := l.failed
	l.failed = nil
	return err
}

// close drains the queue and ends the launcher.
// Precondition: the context's lock must be held.
func (l *launcher) close() {
	l.mu.Lock()
	l.stop = true
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
	<-l.done
}
