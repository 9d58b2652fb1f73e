package pvdriver

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Replies. A synchronous call hands its reply to its caller; how it gets
// there is where a round trip's time goes, so the caller reads it itself
// wherever it can.
//
// Whoever holds a connection's reading turn (replyReader.reading) reads
// its frames; replies to others it meets go to their channels. A
// synchronous call that finds the turn free takes it as it registers and
// reads until its own reply has come; one that finds the turn taken waits
// on its channel. Handing a reply over from a reader goroutine costs a
// wake-up of the parked caller, and a caller in the library is a C thread
// whose goroutine is locked to it, so its wake-up is a second thread's. A
// ping-pong of a locked goroutine over a unix socket on the 2-core VM took
// 106 µs with a reader goroutine handing the reply over, 68 µs reading
// through Go's network poller (which wakes the locked thread from another
// one too) and 31 µs waiting in ppoll(2) on its own thread, as a C program
// does (27 µs).
//
// Over shared memory the caller spins on the ring and then sleeps as the
// transport does. Over a socket (Linux) it reads through sockWaiter
// (sockwait_linux.go): ppoll(2) on its own thread first, for up to
// callerWait, then the read; a reply still not there after that (a long
// synchronisation) is left to Go's poller, whose wait a Close ends.
//
// The connection's reader goroutine reads what arrives while no caller
// holds the turn: over shared memory, replies to calls that wait with
// nobody reading for them (it waits off the ring otherwise, for a kick or
// the connection's end, so the node never rings a doorbell for it); over
// a socket, the same, and while idle it watches for the connection's end
// (POLLRDHUP: a node that refused a pipelined request says why and
// closes). Where a socket cannot be polled so (not Linux), the reader
// goroutine reads every reply, as before.

// ringConn is a transport read without system calls (shared memory): a
// caller may read its reply itself, and flushing a frame costs no more
// than copying it.
type ringConn interface {
	// Done is closed once nothing more can arrive beyond what is buffered.
	Done() <-chan struct{}
}

// replyReader reads one connection's reply frames.
type replyReader struct {
	gen uint64
	fr  *abi.FrameReader
	// done is the transport's Done over shared memory. sock is set over a
	// socket that callers may wait on themselves. With neither, the reader
	// goroutine always holds the turn.
	done <-chan struct{}
	sock *sockWaiter
	// Under Client.mu: someone holds the reading turn; the connection has
	// ended (from then on the reader goroutine reads to the end); over a
	// socket, the reader goroutine holds the turn for one frame (readFor).
	reading, gone, held bool
	// kick wakes the reader goroutine: calls wait with nobody reading.
	kick chan struct{}
}

// newReplyReader makes the reader of connection gen and, if gen is still
// the client's connection, the one calls register with.
func (c *Client) newReplyReader(conn net.Conn, gen uint64) *replyReader {
	rr := &replyReader{gen: gen, kick: make(chan struct{}, 1)}
	if rc, ok := conn.(ringConn); ok {
		rr.done = rc.Done()
		rr.fr = abi.NewFrameReader(conn, c.maxPayload+4096) // frames are copied out of the ring
	} else {
		var src io.Reader = conn
		if rr.sock = newSockWaiter(conn, func() bool { return c.queued.Load() != 0 }); rr.sock != nil {
			src = rr.sock
		}
		rr.fr = abi.NewFrameReader(bufio.NewReaderSize(src, 256<<10), c.maxPayload+4096)
	}
	c.mu.Lock()
	if gen == c.gen {
		c.rd = rr
	}
	c.mu.Unlock()
	return rr
}

// readLoop is connection gen's reader goroutine.
func (c *Client) readLoop(conn net.Conn, gen uint64) {
	rr := c.newReplyReader(conn, gen)
	if rr.sock != nil {
		c.sockReadLoop(rr)
		return
	}
	for {
		if c.claimTurn(rr) {
			for {
				if !c.readReply(rr, false) {
					return
				}
				if !c.keepTurn(rr) {
					break
				}
			}
		}
		select {
		case <-rr.kick:
		case <-rr.done:
			c.mu.Lock()
			rr.gone, rr.done = true, nil
			c.mu.Unlock()
		case <-c.done:
			return
		}
	}
}

// sockReadLoop is the reader goroutine of a socket callers may wait on
// themselves. While calls wait with nobody reading for them it reads for
// them; otherwise it watches for its kick (a caller gave the turn back
// with calls still waiting, or the connection is closing) and, while no
// caller reads either, for the connection's end.
func (c *Client) sockReadLoop(rr *replyReader) {
	defer rr.sock.close()
	for {
		c.mu.Lock()
		over := rr.gen != c.gen || c.err != nil
		callerReads := rr.reading
		orphans := !callerReads && len(c.pending) > 0
		if orphans {
			rr.reading, rr.held = true, true
		}
		c.mu.Unlock()
		switch {
		case over:
			return
		case orphans:
			if !c.readFor(rr) {
				return
			}
			continue
		}
		ended, err := rr.sock.watch(idleWait, !callerReads)
		if err != nil {
			c.lost(rr.gen, err) // closed by whoever moved on: changes nothing
			return
		}
		if ended && c.claimFree(rr) && !c.readFor(rr) {
			return // the end read
		}
	}
}

// readFor reads a reply frame for the calls that wait, holding the turn,
// and gives the turn back; false: the connection is lost.
func (c *Client) readFor(rr *replyReader) bool { return c.readReply(rr, true) }

// releaseHeld gives back the turn the reader goroutine holds (once: a
// caller may hold it by the second time).
func (c *Client) releaseHeld(rr *replyReader) {
	c.mu.Lock()
	if rr.held {
		rr.reading, rr.held = false, false
	}
	c.mu.Unlock()
}

// Socket waits in ppoll are bounded, as a Close of the connection waits
// for them: a read polls up to callerWait before Go's poller takes over
// (sockWaiter.Read), the reader goroutine's idle watch up to idleWait.
const (
	callerWait = 2 * time.Millisecond
	idleWait   = 20 * time.Millisecond
)

// needsReader reports whether the reader goroutine must read rr (under
// c.mu): over shared memory while calls wait or once the connection has
// ended; over a socket callers wait on, while calls wait; over any other
// socket, always.
func (c *Client) needsReader(rr *replyReader) bool {
	if rr.sock != nil {
		return len(c.pending) > 0
	}
	return rr.done == nil || rr.gone || len(c.pending) > 0
}

// wake wakes rr's reader goroutine: calls wait with nobody reading, or
// the connection is closing.
func (rr *replyReader) wake() {
	if rr.sock != nil {
		rr.sock.wake()
		return
	}
	signal(rr.kick)
}

// placeData copies a successful data reply's bytes into dst if there are
// exactly len(dst) of them; otherwise the caller gets the whole reply and
// says what is wrong with it.
func placeData(payload, dst []byte) bool {
	var r abi.DataReply
	st, _, err := abi.DecodeReply(payload, &r)
	if err != nil || st != abi.StatusOK || len(r.Data) != len(dst) {
		return false
	}
	copy(dst, r.Data)
	return true
}

// wakeReaderLocked wakes the current connection's reader goroutine as the
// connection closes: the Close waits for a ppoll of the socket it is in
// (sockWaiter.watch). Precondition: c.mu must be locked.
func (c *Client) wakeReaderLocked() {
	if c.rd != nil {
		c.rd.wake()
	}
}

// selfRead reports whether a caller may read rr's replies itself.
func (rr *replyReader) selfRead() bool { return rr.done != nil || rr.sock != nil }

// claimTurn gives the reader goroutine the turn if it is free and needed.
func (c *Client) claimTurn(rr *replyReader) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rr.reading || !c.needsReader(rr) {
		return false
	}
	rr.reading = true
	return true
}

// claimFree gives the reader goroutine the turn if it is free, needed or
// not (a socket's end, to be read).
func (c *Client) claimFree(rr *replyReader) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rr.reading {
		return false
	}
	rr.reading, rr.held = true, true
	return true
}

// keepTurn reports whether the reader goroutine reads on, giving the turn
// back if not.
func (c *Client) keepTurn(rr *replyReader) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.needsReader(rr) {
		return true
	}
	rr.reading = false
	return false
}

// register makes ch the channel call id's reply goes to, and gives the
// caller the reading turn (drive) where it may read that reply itself.
func (c *Client) register(id uint64, ch chan result) (rr *replyReader, drive bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending == nil {
		return nil, false, c.err
	}
	c.pending[id] = ch
	if c.failover() {
		c.waiting[id] = time.Now()
	}
	rr = c.rd
	if rr != nil && rr.selfRead() && !rr.reading && !rr.gone {
		rr.reading, drive = true, true
	}
	return rr, drive, nil
}

// awaitReply waits for the reply on ch; with the turn (drive) the caller
// reads frames until its own has come.
func (c *Client) awaitReply(rr *replyReader, drive bool, ch chan result) result {
	if drive {
		own := false
		for len(ch) == 0 && c.readReply(rr, false) {
			own = len(ch) > 0
		}
		if own {
			c.stats.ownReads.Add(1)
		}
		c.releaseTurn(rr)
	}
	return <-ch
}

// releaseTurn gives a caller's turn back, and the reader goroutine the
// calls that wait meanwhile.
func (c *Client) releaseTurn(rr *replyReader) {
	c.mu.Lock()
	rr.reading = false
	more := c.needsReader(rr)
	c.mu.Unlock()
	if more {
		rr.wake()
	}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// readReply reads one reply frame of rr's connection and hands it to its
// call. It reports whether reading may go on (false: the connection was
// lost, or the client shut down). With handBack (the reader goroutine
// reading a frame for others) it gives the turn back before it hands the
// reply over, once the frame's bytes are copied out: the woken caller's
// next call then finds the turn free and reads its own reply.
func (c *Client) readReply(rr *replyReader, handBack bool) bool {
	if handBack {
		defer c.releaseHeld(rr)
	}
	f, err := rr.fr.ReadFrame()
	if err != nil {
		c.lost(rr.gen, err)
		return false
	}
	if f.Flags&abi.FlagReply == 0 {
		c.lost(rr.gen, errors.New("hypervisor sent a request frame"))
		return false
	}
	st, _, _ := abi.DecodeReply(f.Payload, nil)
	if st == abi.StatusDeposed && c.failover() {
		// The node was fenced and ran nothing of this request: look for
		// the node that took the session over, as for a lost connection,
		// and resend there (a session it does not hold is lost).
		c.lost(rr.gen, fmt.Errorf("%s answered %s: deposed", f.Op, st))
		return false
	}
	c.mu.Lock()
	if rr.gen != c.gen {
		// A connection the client gave up (a stalled node it moved away
		// from): what it still waits for comes from the new node, which
		// also had every request kept since this reply's.
		c.mu.Unlock()
		return false
	}
	if c.failover() && (f.Op.Info().Commits || st != abi.StatusOK) {
		c.committedLocked(f.RequestID, st != abi.StatusOK)
	}
	ch := c.pending[f.RequestID]
	into := c.into[ch]
	delete(c.pending, f.RequestID)
	delete(c.waiting, f.RequestID)
	abandoned := c.abandoned[f.RequestID]
	delete(c.abandoned, f.RequestID)
	c.mu.Unlock()
	if abandoned {
		return true
	}
	if ch != nil {
		r := result{placed: true}
		if into == nil || !placeData(f.Payload, into) {
			r = result{payload: append([]byte(nil), f.Payload...)}
		}
		if handBack {
			c.releaseHeld(rr)
		}
		ch <- r
		return true
	}
	if c.answeredBefore(f.RequestID) {
		return true
	}
	// A reply nobody waits for answers a pipelined request whose frame
	// the hypervisor could not accept; it closes the connection next.
	_, msg, _ := abi.DecodeReply(f.Payload, nil)
	c.shutdown(fmt.Errorf("%w: hypervisor refused a pipelined %s: %s: %s", ErrClosed, f.Op, st, msg))
	return false
}
