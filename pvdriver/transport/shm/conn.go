package shm

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Conn is one end of a shared-memory connection. Like a socket it may be
// read by one goroutine while another writes; Close may come from any.
type Conn struct {
	ctl  *net.UnixConn // the handshake socket: identity, liveness, doorbells
	raw  syscall.RawConn
	area []byte // the whole shared mapping
	// in is the ring this side consumes, out the one it produces.
	in, out *ring
	unmap   func([]byte)
	onClose func()

	// The socket's reader (watchPeer) turns the peer's doorbell bytes
	// into these: bytes arrived in in, room freed in out.
	dataCh, spaceCh chan struct{}
	gone            chan struct{} // closed when the peer is gone
	closedCh        chan struct{} // closed by Close
	rdDeadline      atomic.Int64  // unix nanoseconds, 0 for none
	wrDeadline      atomic.Int64

	// mu is held shared by every Read and Write and exclusively by Close
	// while it unmaps the area, so no copy ever runs on an unmapped area.
	mu       sync.RWMutex
	closed   atomic.Bool
	peerGone atomic.Bool // the peer closed the socket: drain, then EOF
	once     sync.Once
	rdMu     sync.Mutex // one reader at a time (like a socket's fd lock)
	wrMu     sync.Mutex // one writer at a time
	failMu   sync.Mutex
	failed   error       // set once the peer corrupted the area
	broken   atomic.Bool // failed is set (read without the lock while spinning)
	// maxSpin bounds how long a side spins before it sleeps (clampSpin).
	maxSpin time.Duration
	// busyPoll is how long a wait polls before it first yields its P
	// (pollWithoutYield).
	busyPoll time.Duration
	// host is the guest's host-memory region, if it handed one over
	// (hostmem.go).
	host hostRegion
	// stats is where this side's sleeps and doorbells are counted (the
	// guest's or the node's half of the process's Stats).
	stats *sideStats
}

// Stats counts, for the whole process, how often each side of its
// shared-memory connections gave up spinning and slept, and how many
// doorbells it rang to wake a sleeping peer. A busy pair does neither: a
// synchronous call that costs a sleep costs a wake-up of a goroutine too.
type Stats struct {
	GuestSleeps, GuestDoorbells uint64 // on connections this process dialled
	NodeSleeps, NodeDoorbells   uint64 // on connections it accepted
}

type sideStats struct{ sleeps, doorbells atomic.Uint64 }

var guestStats, nodeStats sideStats

// ReadStats returns the counts so far.
func ReadStats() Stats {
	return Stats{
		GuestSleeps: guestStats.sleeps.Load(), GuestDoorbells: guestStats.doorbells.Load(),
		NodeSleeps: nodeStats.sleeps.Load(), NodeDoorbells: nodeStats.doorbells.Load(),
	}
}

// Doorbell bytes on the socket. Each side writes them without blocking
// (a full socket buffer already holds plenty of wake-ups), and only while
// the other side's asleep flag is up. The socket rather than an eventfd:
// an eventfd's open file is shared with the peer, which could make it
// blocking or saturate its counter and so hang the other side's thread;
// a socket end is each side's own.
const (
	bellData  = 'D' // bytes are waiting in the ring you consume
	bellSpace = 'S' // room was freed in the ring you produce
)

func newConnCore(uc *net.UnixConn, area []byte, in, out *ring) (*Conn, error) {
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, err
	}
	c := &Conn{
		ctl: uc, raw: raw, area: area, in: in, out: out,
		dataCh: make(chan struct{}, 1), spaceCh: make(chan struct{}, 1),
		gone: make(chan struct{}), closedCh: make(chan struct{}),
		maxSpin: DefaultMaxSpin, stats: &guestStats,
		busyPoll: pollWithoutYield(runtime.GOMAXPROCS(0)),
	}
	go c.watchPeer()
	return c, nil
}

// errPeerGone is what a wait returns once the peer has closed and nothing
// more can come.
var errPeerGone = errors.New("shm: peer closed the connection")

// watchPeer reads the peer's doorbells until its socket ends; a byte that
// is no doorbell ends the connection (the peer has no business sending it).
func (c *Conn) watchPeer() {
	defer func() {
		c.peerGone.Store(true)
		close(c.gone)
	}()
	buf := make([]byte, 64)
	for {
		n, err := c.ctl.Read(buf)
		if err != nil {
			return
		}
		for _, b := range buf[:n] {
			switch b {
			case bellData:
				signal(c.dataCh)
			case bellSpace:
				signal(c.spaceCh)
			default:
				c.fail(fmt.Errorf("%w: unexpected byte %#x on the socket", ErrCorrupt, b))
				return
			}
		}
	}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// wake rings bell if the peer sleeps on asleep, taking its flag down so
// that a burst of writes (pipelined frames) rings it once: the peer wakes,
// finds all of them, and raises the flag again only before its next sleep.
// A peer that sets the flag to anything else is never rung: only its own
// side then oversleeps (until its next poll of the ring).
func (c *Conn) wake(asleep *atomic.Uint32, bell byte) {
	if asleep.Load() == 1 && asleep.CompareAndSwap(1, 0) {
		c.stats.doorbells.Add(1)
		c.ring(bell)
	}
}

// ring writes a doorbell byte without ever blocking.
func (c *Conn) ring(b byte) {
	c.raw.Write(func(fd uintptr) bool {
		writeByte(fd, b)
		return true
	})
}

// Read reads bytes the peer wrote, copying them out of the shared ring.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.rdMu.Lock()
	defer c.rdMu.Unlock()
	c.mu.RLock()
	defer c.mu.RUnlock()
	if err := c.awaitIn(1); err != nil {
		return 0, err
	}
	n, err := c.in.readable()
	if err != nil {
		return 0, c.opError("read", c.fail(err))
	}
	k := c.in.take(p, n)
	c.wake(c.in.spaceSleep, bellSpace)
	return k, nil
}

// Write writes all of p into the shared ring, waiting for room as needed.
func (c *Conn) Write(p []byte) (int, error) {
	c.wrMu.Lock()
	defer c.wrMu.Unlock()
	c.mu.RLock()
	defer c.mu.RUnlock()
	done := 0
	for done < len(p) {
		if err := c.usable(); err != nil {
			return done, c.opError("write", err)
		}
		if c.peerGone.Load() {
			return done, c.opError("write", syscall.EPIPE)
		}
		free, err := c.out.writable()
		if err != nil {
			return done, c.opError("write", c.fail(err))
		}
		if free > 0 {
			done += c.out.put(p[done:], free)
			c.wake(c.out.dataSleep, bellData)
			continue
		}
		err = c.wait(c.out.writable, c.out.spaceSleep, c.spaceCh, &c.wrDeadline, &c.out.spin)
		if err == errPeerGone {
			err = syscall.EPIPE
		}
		if err != nil {
			return done, c.opError("write", err)
		}
	}
	return done, nil
}

// wait returns once ready reports bytes (or room), after spinning for
// *spin and then sleeping on bell with the asleep flag raised. While it
// spins it lets other goroutines run every few polls, except in its first
// busyPoll.
func (c *Conn) wait(ready func() (uint64, error), asleep *atomic.Uint32, bell chan struct{}, deadline *atomic.Int64, spin *time.Duration) error {
	start := time.Now()
	check := func() (bool, error) {
		n, err := ready()
		if err != nil {
			return false, c.fail(err)
		}
		if n > 0 {
			adapt(spin, time.Since(start), c.maxSpin)
			return true, nil
		}
		if err := c.usable(); err != nil {
			return false, err
		}
		if c.peerGone.Load() {
			// It may have published its last bytes just before it went.
			if n, err := ready(); err == nil && n > 0 {
				return true, nil
			}
			return false, errPeerGone
		}
		return false, nil
	}
	for i := 0; ; i++ {
		if ok, err := check(); ok || err != nil {
			return err
		}
		if i%32 == 31 {
			waited := time.Since(start)
			if waited >= *spin {
				break
			}
			if waited >= c.busyPoll {
				runtime.Gosched()
			}
		}
	}
	for {
		asleep.Store(1)
		ok, err := check() // the peer may have published just before the flag went up
		if ok || err != nil {
			asleep.Store(0)
			return err
		}
		c.stats.sleeps.Add(1)
		err = sleep(bell, c.gone, c.closedCh, deadline)
		asleep.Store(0)
		if err != nil {
			return err
		}
		if ok, err := check(); ok || err != nil {
			return err
		}
	}
}

// sleep waits for a doorbell, the peer's end, Close or the deadline.
func sleep(bell, gone, closed chan struct{}, deadline *atomic.Int64) error {
	var timeout <-chan time.Time
	if d := deadline.Load(); d != 0 {
		left := time.Until(time.Unix(0, d))
		if left <= 0 {
			return os.ErrDeadlineExceeded
		}
		t := time.NewTimer(left)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-bell:
	case <-gone:
	case <-closed:
	case <-timeout:
		return os.ErrDeadlineExceeded
	}
	return nil
}

// usable reports why the connection can no longer be used, if it cannot.
func (c *Conn) usable() error {
	if c.closed.Load() {
		return net.ErrClosed
	}
	if !c.broken.Load() {
		return nil
	}
	c.failMu.Lock()
	defer c.failMu.Unlock()
	return c.failed
}

// fail remembers that the peer corrupted the area: the connection is
// unusable from now on, and the peer is told by the socket closing.
func (c *Conn) fail(err error) error {
	c.failMu.Lock()
	if c.failed == nil {
		c.failed = err
		c.broken.Store(true)
	}
	c.failMu.Unlock()
	c.ctl.CloseWrite()
	return err
}

func (c *Conn) opError(op string, err error) error {
	if err == io.EOF {
		return err
	}
	return &net.OpError{Op: op, Net: "shm+unix", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}

// Close ends the connection and unmaps the area once no Read or Write is
// using it.
func (c *Conn) Close() error {
	first := false
	c.once.Do(func() {
		first = true
		c.closed.Store(true)
		close(c.closedCh) // wakes a sleeping Read or Write
		c.ctl.Close()
		c.mu.Lock()
		c.unmap(c.area)
		c.area = nil
		c.mu.Unlock()
		if c.onClose != nil {
			c.onClose()
		}
	})
	if !first {
		return c.opError("close", net.ErrClosed)
	}
	return nil
}

// Done is closed once nothing more can arrive from the peer beyond what
// the ring holds: it closed its end, the connection failed or was closed.
// A reader that waits for it instead of sleeping in Read leaves the
// peer's doorbell alone (pvdriver's reply reader, while its caller reads
// for itself).
func (c *Conn) Done() <-chan struct{} { return c.gone }

// SharedMemory is the mapped area (control blocks and both rings), for a
// GPU backend to page-lock. Its bytes belong to both sides: anyone reading
// them must copy before checking. It is valid until Close.
func (c *Conn) SharedMemory() []byte {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.area
}

// LocalAddr and RemoteAddr are the unix socket's.
func (c *Conn) LocalAddr() net.Addr  { return c.ctl.LocalAddr() }
func (c *Conn) RemoteAddr() net.Addr { return c.ctl.RemoteAddr() }

// SyscallConn is the unix socket's, so the peer's credentials
// (SO_PEERCRED) can be asked for as on any unix connection.
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return c.ctl.SyscallConn() }

// SetDeadline sets both deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	c.SetReadDeadline(t)
	return c.SetWriteDeadline(t)
}

// SetReadDeadline bounds how long a Read sleeps waiting for bytes.
func (c *Conn) SetReadDeadline(t time.Time) error {
	setDeadline(&c.rdDeadline, t)
	signal(c.dataCh) // a sleeping Read looks at the new deadline
	return nil
}

// SetWriteDeadline bounds how long a Write sleeps waiting for room.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	setDeadline(&c.wrDeadline, t)
	signal(c.spaceCh)
	return nil
}

func setDeadline(d *atomic.Int64, t time.Time) {
	if t.IsZero() {
		d.Store(0)
		return
	}
	d.Store(t.UnixNano())
}
