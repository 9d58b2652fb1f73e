package guestconn

import (
	"bufio"
	"errors"
	"os"
	"sync"
	"time"
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
//
// What a connection holds for its guest is bounded by what the guest
// reads (back-pressure). Once its queued replies hold more than
// Config.ReplyQueueBytes, the connection reads none of the guest's
// requests until replies went out: a guest that sends reads and reads no
// reply holds at most that bound and one reply on the node (the default,
// 64 MiB, is four replies of the largest payload; the guest driver sends
// a copy_dtoh once the last one's reply came, and a pipelined piece's
// reply is a few bytes, so a guest that reads its replies never waits for
// it). The replies go out through the connection's writer with a deadline
// (replyWriter): a guest that takes longer than Config.WriteTimeout to
// read writeChunk bytes loses its connection, whose session is then kept
// for its grace period like any other whose connection dropped.
type replyQueue struct {
	mu   sync.Mutex
	cond sync.Cond // signalled when pending changes or the queue closes
	// pending holds queued replies, oldest first; the head stays until it
	// is written, so an empty queue means the writer is the connection's.
	// bytes is what they hold.
	pending []queuedReply
	bytes   int64
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

// queuedReplyOverhead is what a queued reply holds besides its frame's
// bytes (its entry, the frame's allocation, its wait), so that a guest's
// many small replies count for what they cost.
const queuedReplyOverhead = 128

// cost is the bytes a queued reply counts against Config.ReplyQueueBytes.
func (r queuedReply) cost() int64 { return int64(len(r.frame)) + queuedReplyOverhead }

// reply sends or queues one reply frame (c.out may be reused after it
// returns); held, if not nil, reports once the reply may go, or false if
// it never may. It returns false if the connection must end. It returns
// once the connection may read the guest's next request: a reply queued
// behind more than Config.ReplyQueueBytes waits until replies went out.
func (c *guestConn) reply(frame []byte, held func() bool) bool { return c.replyParts(frame, nil, held) }

// splitReplyMin is the smallest read whose reply goes as a head and the
// data where the node read it (replyParts): below it, the copy into the
// frame costs less than a second write.
const splitReplyMin = 64 << 10

// replyParts is reply for a frame given as its head and a tail that
// follows it (a read's data, abi.AppendDataReplyFrameHead): sent at once,
// the tail goes from where it lies, past the writer's buffer; queued, the
// two are joined, as a queued frame is copied.
func (c *guestConn) replyParts(frame, tail []byte, held func() bool) bool {
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
		if err == nil && len(tail) > 0 {
			_, err = c.bw.Write(tail)
		}
		return err == nil
	}
	r := queuedReply{frame: append(append(make([]byte, 0, len(frame)+len(tail)), frame...), tail...), held: held}
	q.pending = append(q.pending, r)
	c.queuedBytes(r.cost())
	if !q.started {
		q.started, q.stopped = true, make(chan struct{})
		go c.sendQueued()
	}
	q.cond.Broadcast()
	for q.bytes > c.e.cfg.ReplyQueueBytes && !q.dead {
		q.cond.Wait() // back-pressure: the guest reads replies first
	}
	dead := q.dead
	q.mu.Unlock()
	return !dead
}

// queuedBytes adds n (negative: takes) to the reply bytes the connection
// and its edge hold queued.
// Precondition: c.replies.mu must be locked.
func (c *guestConn) queuedBytes(n int64) {
	c.replies.bytes += n
	c.e.queued.Add(n)
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
		c.queuedBytes(-r.cost())
		q.pending[0] = queuedReply{}
		q.pending = q.pending[1:]
		if ok && len(q.pending) == 0 {
			ok = c.flush() == nil
		}
		q.cond.Broadcast() // a settle, or a reply held back by the bound, may be waiting
		if !ok {
			for _, r := range q.pending {
				c.queuedBytes(-r.cost())
			}
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

// writeChunk is the most reply bytes written under one deadline: a guest
// must read that much within Config.WriteTimeout, not a whole reply.
const writeChunk = 1 << 20

// replyWriter is what a connection's buffered writer writes to: the
// guest's connection, each writeChunk bytes under a fresh deadline of
// Config.WriteTimeout. A write past its deadline fails, and the
// connection ends (its writer keeps the error: the connection's reply
// then fails, or the sending goroutine closes it).
type replyWriter struct{ c *guestConn }

func (w replyWriter) Write(p []byte) (int, error) {
	c, timeout := w.c, w.c.e.cfg.WriteTimeout
	done := 0
	for done < len(p) {
		if timeout > 0 {
			c.conn.SetWriteDeadline(time.Now().Add(timeout))
		}
		n, err := c.conn.Write(p[done:min(len(p), done+writeChunk)])
		done += n
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				c.writeTimedOut()
			}
			return done, err
		}
	}
	return done, nil
}

// writeTimedOut notes a guest that read none of its replies for the write
// timeout; the connection ends.
func (c *guestConn) writeTimedOut() {
	if m := c.e.metrics; m != nil && m.WriteTimeouts != nil {
		m.WriteTimeouts.Inc()
	}
	c.log.Warn("dropping guest connection: the guest read none of its replies in time; its session is kept for its grace period",
		"write_timeout", c.e.cfg.WriteTimeout)
}

// newWriter is the connection's buffered writer of size bytes, over
// replyWriter.
func (c *guestConn) newWriter(size int) *bufio.Writer {
	return bufio.NewWriterSize(replyWriter{c}, size)
}
