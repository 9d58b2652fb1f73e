package pvdriver

import (
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

// outFrame is one encoded request frame on its way out. Its buffer has
// owners, counted in refs: the caller that built it until it hands it to
// the writer (send), the writer while it writes it (the queue's reference
// passes to it, a resend takes one more), and, with failover on, the kept
// list until a commit point forgets it. Whoever drops the last reference
// gives the buffer back to the client's pool, so a buffer is never reused
// while anyone still reads it: not the writer streaming a 16 MiB copy
// whose commit reply already came back, not a resend after a failover.
type outFrame struct {
	b    []byte
	refs atomic.Int32
	pool *framePool
}

// hold takes one more reference.
func (f *outFrame) hold() { f.refs.Add(1) }

// release drops a reference; the last one returns the buffer to the pool.
func (f *outFrame) release() {
	switch n := f.refs.Add(-1); {
	case n == 0:
		f.pool.put(f.b)
		f.b = nil
	case n < 0:
		panic("pvdriver: frame released more often than held")
	}
}

// framePool keeps request frame buffers for reuse by size class (powers of
// two from minPooled), with at most maxIdle bytes idle. A bulk copy builds
// one frame per 16 MiB chunk: taken from here it reuses the last chunk's
// buffer instead of paying for a fresh one in page faults and zeroing.
type framePool struct {
	mu   sync.Mutex
	free map[int][][]byte // by capacity
	idle int
}

// Pool bounds.
const (
	minPooled = 4 << 10
	maxPooled = 32 << 20
	maxIdle   = 64 << 20
)

// frameClass is the pooled capacity for a frame of n bytes.
func frameClass(n int) int {
	if n <= minPooled {
		return minPooled
	}
	return 1 << bits.Len(uint(n-1))
}

// get returns an empty buffer with room for at least n bytes.
func (p *framePool) get(n int) []byte {
	c := frameClass(n)
	p.mu.Lock()
	if l := p.free[c]; len(l) > 0 {
		b := l[len(l)-1]
		p.free[c] = l[:len(l)-1]
		p.idle -= c
		p.mu.Unlock()
		return b[:0]
	}
	p.mu.Unlock()
	return make([]byte, 0, c)
}

// put keeps b for reuse if it is of a pooled class and the pool has room.
func (p *framePool) put(b []byte) {
	c := cap(b)
	if c < minPooled || c > maxPooled || c != frameClass(c) {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.idle+c > maxIdle {
		return
	}
	if p.free == nil {
		p.free = map[int][][]byte{}
	}
	p.free[c] = append(p.free[c], b)
	p.idle += c
}

// Writing. Frames go out on the connection's buffered writer (Client.bw,
// under wmu; nil while the connection is down), in the order their calls
// were made. A small synchronous call's frame, and over shared memory a
// small pipelined one, is written by its caller's own goroutine: handing
// it to the writer goroutine would cost a wake-up of that goroutine per
// call. Everything else, and every frame while others wait in the queue
// (queued counts them until written), goes through the writer goroutine,
// which batches a burst into few flushes and streams large frames while
// their callers build the next.

// directFrameMax is the largest frame a caller writes itself.
const directFrameMax = 64 << 10

// writeDirect writes f on the caller's goroutine if it may (see above),
// flushing if told, reporting whether it did; the frame's reference is
// then used up.
func (c *Client) writeDirect(f *outFrame, sync, flush bool) bool {
	if len(f.b) > directFrameMax {
		return false
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.bw == nil || !(sync || c.wring) || c.queued.Load() != 0 {
		return false
	}
	select {
	case <-c.done:
		return false // send reports why
	default:
	}
	c.writeFrame(f, flush)
	return true
}

// flushHeld flushes frames written without a flush (a burst of calls sent
// together: callThenRead); a failure loses the connection.
func (c *Client) flushHeld() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.bw == nil || c.bw.Buffered() == 0 {
		return
	}
	c.writingSince.Store(time.Now().UnixNano()) // a frozen node blocks this write (stalled)
	c.endWrite(nil, true)
}

// writeFrame writes f and drops the writer's reference to it, flushing if
// told; a failure loses the connection. wmu must be held and bw set.
func (c *Client) writeFrame(f *outFrame, flush bool) {
	c.markSent(f)
	c.writingSince.Store(time.Now().UnixNano()) // a frozen node blocks this write (stalled)
	_, err := c.bw.Write(f.b)
	f.release() // the kept list may still hold it
	c.endWrite(err, flush)
}

// endWrite ends a write that began by marking writingSince, err its
// outcome so far: it flushes if told and the write succeeded, clears the
// mark, and loses the connection on a failure. wmu must be held and bw set.
func (c *Client) endWrite(err error, flush bool) {
	if err == nil && flush {
		err = c.bw.Flush()
	}
	c.writingSince.Store(0)
	if err != nil {
		c.lost(c.wgen, err)
		c.bw = nil
	}
}
