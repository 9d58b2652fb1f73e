package guestconn

import (
	"errors"
	"sync"
)

// A replicated node holds a reply until the standby has what it reports
// (the mode's commit rule, Node.ReplyGate). The connection does not wait
// with it: replyQueue sends a connection's replies in request order, each
// once its rule holds, while the connection goes on reading and running
// the requests behind it. A guest with several calls in flight (a large
// copy's pieces) thus has the next piece on the GPU and on its way to the
// standby while the previous one is being acknowledged, instead of one
// piece's round trip after another. Requests still run one at a time and
// in order; only the waiting moved, so no reply overtakes an earlier one
// and none is sent before the standby holds everything it may reflect.
//
// The connection runs ahead only while the guest has sent more: with
// nothing more to read, it settles (waits for its queued replies) before
// it reads again, so a guest that waits for each reply sees the same
// latency as before this queue existed.
//
// A reply goes straight to the connection's writer when none is queued
// before it and it either needs no wait or the guest has sent nothing
// more (it then waits where it is): an unreplicated node, and a guest
// that waits for each reply, never queue, and pay nothing for this.
type replyQueue struct {
	mu   sync.Mutex
	cond sync.Cond // signalled when pending changes or the queue closes
	// pending holds queued replies, oldest first; the head stays until it
	// is written, so an empty queue means the writer is the connection's.
	pending []queuedReply
	started bool // the sending goroutine runs
	closing bool // the connection ends: send what is queued, then stop
	dead    bool // a reply could not be sent, or must not be: none after it may be
	stopped chan struct{}
}

// queuedReply is a reply frame and what it waits for (nil: nothing).
type queuedReply struct {
	frame []byte
	held  func() bool
}

// reply sends or queues one reply frame (c.out may be reused after it
// returns); held, if not nil, reports once the reply may go, or false if
// it never may. It returns false if the connection must end.
func (c *guestConn) reply(frame []byte, held func() bool) bool {
	q := &c.replies
	q.mu.Lock()
	if q.dead {
		q.mu.Unlock()
		return false
	}
	if len(q.pending) == 0 && (held == nil || !c.moreToRead()) {
		// Nothing queued before it, and nothing to run meanwhile: wait
		// here, as the sending goroutine would, without handing over.
		q.mu.Unlock()
		if held != nil && !c.mayGo(held) {
			return false
		}
		_, err := c.bw.Write(frame)
		return err == nil
	}
	q.pending = append(q.pending, queuedReply{frame: append([]byte(nil), frame...), held: held})
	if !q.started {
		q.started, q.stopped = true, make(chan struct{})
		go c.sendQueued()
	}
	q.cond.Broadcast()
	q.mu.Unlock()
	return true
}

// mayGo waits until a reply held by held (nil: nothing) may be sent and
// reports whether it may: its rule holds and the node's lease has not run
// out meanwhile.
func (c *guestConn) mayGo(held func() bool) bool {
	return (held == nil || held()) && !c.e.node.LeaseExpired()
}

// moreToRead reports whether the guest has sent more than the connection
// has read.
func (c *guestConn) moreToRead() bool { return c.br != nil && c.br.Buffered() > 0 }

// settle waits until every queued reply is sent (the sending goroutine
// flushes after the last) and flushes the writer. The connection settles
// whenever the guest has sent nothing more: a guest that waits for each
// reply gets it as soon as it may go, and its next request finds the
// connection reading, as on an unreplicated node; only requests already
// sent run ahead of a held reply.
func (c *guestConn) settle() error {
	q := &c.replies
	q.mu.Lock()
	for len(q.pending) > 0 && !q.dead {
		q.cond.Wait()
	}
	dead := q.dead
	q.mu.Unlock()
	if dead {
		return errRepliesStopped
	}
	return c.flush()
}

// flush flushes the connection's writer; once the reply to a hello that
// opened a session has gone out, the guest knows of the session.
func (c *guestConn) flush() error {
	err := c.bw.Flush()
	if err == nil && c.helloWritten.Load() {
		c.helloUnanswered.Store(false)
	}
	return err
}

// errRepliesStopped: a reply could not be sent, and the connection ends.
var errRepliesStopped = errors.New("hypervisor: a held reply could not be sent; the connection ends")

// sendQueued sends queued replies in order as each may go, flushing when
// none is left. A reply that may never go (the node is going down, or its
// lease ran out) ends the connection without it or any after it: the
// guest resumes on the standby and resends.
func (c *guestConn) sendQueued() {
	q := &c.replies
	defer close(q.stopped)
	for {
		q.mu.Lock()
		for len(q.pending) == 0 && !q.closing {
			q.cond.Wait()
		}
		if len(q.pending) == 0 {
			q.mu.Unlock()
			return
		}
		r := q.pending[0]
		q.mu.Unlock()
		ok := c.mayGo(r.held)
		if ok {
			_, err := c.bw.Write(r.frame)
			ok = err == nil
		}
		q.mu.Lock()
		q.pending[0] = queuedReply{}
		q.pending = q.pending[1:]
		if ok && len(q.pending) == 0 {
			ok = c.flush() == nil
		}
		q.cond.Broadcast() // a settle may be waiting for the queue to empty
		if !ok {
			q.dead, q.pending = true, nil
			q.mu.Unlock()
			c.conn.Close() // the reader stops; the connection ends
			return
		}
		q.mu.Unlock()
	}
}

// drainReplies sends what is queued and stops the sending goroutine;
// called as the connection ends.
func (c *guestConn) drainReplies() {
	q := &c.replies
	q.mu.Lock()
	q.closing = true
	started := q.started
	if started {
		q.cond.Broadcast()
	}
	q.mu.Unlock()
	if started {
		<-q.stopped
	}
}
