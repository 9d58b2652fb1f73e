package pvdriver

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Replies. Over a socket one goroutine per connection (readLoop) reads
// every reply and hands each to its caller over the call's channel.
//
// Over shared memory that hand-off (a reader goroutine waking a parked
// caller, several microseconds each time) would cost more than the ring
// itself, so the connection's replies are read by whoever holds its
// reading turn (replyReader.reading): a synchronous call that finds the
// turn free takes it as it registers, and reads frames itself, spinning on
// the ring and then sleeping as the transport does, until its own reply
// has come; replies to others it meets go to their channels. A call that
// finds the turn taken waits on its channel. The reader goroutine holds the
// turn only while calls wait with nobody reading for them; otherwise it
// waits off the ring (for a kick, or the connection's end), so the node
// never rings a doorbell for it.

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
	// done is the transport's Done over shared memory; nil over a socket,
	// whose reader goroutine always holds the turn.
	done <-chan struct{}
	// Under Client.mu: someone holds the reading turn; the connection has
	// ended (from then on the reader goroutine reads to the end).
	reading, gone bool
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
		rr.fr = abi.NewFrameReader(bufio.NewReaderSize(conn, 256<<10), c.maxPayload+4096)
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
	for {
		if c.claimTurn(rr) {
			for {
				if !c.readReply(rr) {
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

// needsReader reports whether the reader goroutine must read rr (under
// c.mu): always over a socket; over shared memory while calls wait or once
// the connection has ended.
func (c *Client) needsReader(rr *replyReader) bool {
	return rr.done == nil || rr.gone || len(c.pending) > 0
}

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
	if rr != nil && rr.done != nil && !rr.reading && !rr.gone {
		rr.reading, drive = true, true
	}
	return rr, drive, nil
}

// awaitReply waits for the reply on ch; with the turn (drive) the caller
// reads frames until its own has come.
func (c *Client) awaitReply(rr *replyReader, drive bool, ch chan result) result {
	if drive {
		for len(ch) == 0 && c.readReply(rr) {
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
		signal(rr.kick)
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
// lost, or the client shut down).
func (c *Client) readReply(rr *replyReader) bool {
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
	delete(c.pending, f.RequestID)
	delete(c.waiting, f.RequestID)
	abandoned := c.abandoned[f.RequestID]
	delete(c.abandoned, f.RequestID)
	c.mu.Unlock()
	if abandoned {
		return true
	}
	if ch != nil {
		ch <- result{payload: append([]byte(nil), f.Payload...)}
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
