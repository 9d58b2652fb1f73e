package guestconn

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"github.com/vgpuha/vgpuha/hypervisor/internal/guesterr"
	"github.com/vgpuha/vgpuha/hypervisor/tenancy"
	"github.com/vgpuha/vgpuha/mmiotrace"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/pvdriver/transport"
)

// guestConn is one guest connection being served: one goroutine reads its
// frames, runs them in order and writes the replies.
type guestConn struct {
	e      *Edge
	conn   net.Conn
	br     buffered // nil before hello: frames are read straight from conn
	bw     *bufio.Writer
	fr     *abi.FrameReader
	log    *slog.Logger
	tenant string  // who the transport says the guest is (package tenancy)
	sess   Session // nil until hello
	status Status  // a status connection's, after its status_hello (sess stays nil)
	host   *Region // the guest's host-memory region, if any (hostmem.go)
	out    []byte  // the reply frame being written, reused from reply to reply
	// refusals counts this connection's refused requests: the first few
	// are logged, then one in a thousand (each is counted in metrics).
	refusals int
	counted  OKCounters
	replies  replyQueue // replies waiting for the commit rule (replies.go)
	// helloUnanswered: the hello opened a new session whose reply has
	// not gone out (its commit rule did not hold yet, or it was not
	// flushed); helloWritten: that reply may go and is being written. If
	// the connection ends before it went out, the guest never learned of
	// the session and nobody can resume it: it is freed at once (finish).
	helloUnanswered, helloWritten atomic.Bool
}

// ServeConn serves one guest connection until it ends. A frame that cannot
// be trusted (bad magic, version or checksum, over-long) gets an error reply
// and ends the connection; a well-framed request with bad content gets an
// error reply and the connection goes on. Either way only this connection's
// session is affected.
func (e *Edge) ServeConn(conn net.Conn) {
	defer conn.Close()
	// Until hello a connection gets small buffers and helloTimeout to say
	// it: one that never does costs little and not for long.
	c := &guestConn{
		e: e, conn: conn,
		fr:     abi.NewFrameReader(conn, helloMaxPayload),
		tenant: tenancy.Of(conn),
	}
	c.bw = c.newWriter(4096)
	c.replies.cond.L = &c.replies.mu
	c.log = e.log.With("remote", conn.RemoteAddr().String(), "tenant", c.tenant)
	conn.SetReadDeadline(time.Now().Add(helloTimeout))
	defer c.registerShared()() // before conn.Close unmaps the area
	defer c.takeHostMemory()() // once the session is detached
	defer c.finish()
	for {
		f, err := c.fr.ReadFrame()
		var more bool
		if err != nil {
			more = c.frameError(f, err)
		} else {
			more = c.serve(f)
		}
		if !more {
			return
		}
		if !c.moreToRead() {
			if c.sess != nil {
				c.sess.Idle()
			}
			if err := c.settle(); err != nil {
				return
			}
		}
	}
}

// sharedMemory is a transport whose bytes lie in memory shared with the
// guest (pvdriver/transport/shm).
type sharedMemory interface{ SharedMemory() []byte }

// registerShared page-locks a shared-memory guest's area with a backend
// that can (gpu.HostRegistrar), so device copies from it run at DMA rate.
// It returns what undoes that. Failing to register costs speed, not
// correctness: it is logged and the connection goes on.
func (c *guestConn) registerShared() (unregister func()) {
	sm, ok := c.conn.(sharedMemory)
	if !ok {
		return func() {}
	}
	return c.pageLock(sm.SharedMemory(), "shared memory")
}

// buffered is a reader that knows how many bytes it could return at once
// (a bufio.Reader, or a shared-memory connection: its ring).
type buffered interface{ Buffered() int }

// helloTimeout bounds how long a connection may take to say hello.
const helloTimeout = 10 * time.Second

// upgrade gives a connection whose session is open the buffers and limits
// of a guest: larger buffered reads and writes, frames up to MaxPayload
// drawn from the node's budget, no read deadline (writes keep theirs).
func (c *guestConn) upgrade() {
	c.conn.SetReadDeadline(time.Time{})
	c.bw.Flush()
	c.bw = c.newWriter(64 << 10)
	c.fr.Release()
	if sr, ok := c.conn.(spanConn); ok {
		// Shared memory: frames are copied out of the ring without a
		// buffer between, and large copies' data is left there (Ring).
		c.br = sr
		c.fr = abi.NewFrameReader(sr, c.e.cfg.MaxPayload)
		c.fr.SetSpanReader(sr)
	} else {
		transport.WidenBuffers(c.conn)
		br := bufio.NewReaderSize(c.conn, 64<<10) // nothing read ahead so far
		c.br = br
		c.fr = abi.NewFrameReader(br, c.e.cfg.MaxPayload)
	}
	c.fr.SetBudget(c.e.budget)
}

// spanConn is a transport whose bytes can be read where they lie.
type spanConn interface {
	abi.SpanReader
	buffered
}

// finish lets go of the connection's session (kept for a resume, or
// freed). Until it has, a hello that finds no free slot waits for it
// (the hypervisor's takeSlot).
func (c *guestConn) finish() {
	if c.status != nil {
		c.status.Close()
	}
	if c.sess != nil {
		defer c.e.node.SessionEnding()()
	}
	c.drainReplies()
	c.fr.Release()
	if c.sess == nil {
		return
	}
	if c.helloUnanswered.Load() {
		c.sess.EndGrace()
		c.log.Info("guest connection ended before its new session could be answered; freeing the session")
	}
	c.e.node.Detach(c.sess, c.log)
}

// answeringHello wraps what the reply to a hello that opened a session
// waits for (nil: nothing), noting that the guest has not been told of
// the session (helloUnanswered) until the reply may go and a flush after
// it succeeds (flush).
func (c *guestConn) answeringHello(held func() bool) func() bool {
	c.helloUnanswered.Store(true)
	return func() bool {
		if held != nil && !held() {
			return false
		}
		c.helloWritten.Store(true)
		return true
	}
}

// opensSession reports whether a hello's payload asks for a new session
// (not a resume).
func opensSession(payload []byte) bool {
	var req abi.Hello
	return abi.Unmarshal(payload, &req) == nil && req.Resume == 0
}

// goodbye ends the session of a guest that is done (OpBye): the replies
// before the bye go out, the session is freed, and then, if the guest
// waits for it (a bye sent as a call), the bye is answered, so that its
// slot is free by the time the guest's process exits.
func (c *guestConn) goodbye(f abi.Frame) {
	c.sess.EndGrace() // the guest is done: free the session now
	if err := c.settle(); err != nil {
		return // finish frees the session
	}
	done := c.e.node.SessionEnding()
	c.e.node.Detach(c.sess, c.log)
	c.sess = nil
	done()
	if f.Flags&abi.FlagAsync == 0 {
		c.out = abi.AppendReplyFrame(c.out[:0], f.Version, f.Op, f.RequestID, abi.StatusOK, "", nil)
		if c.reply(c.out, nil) {
			c.settle()
		}
	}
}

// frameError handles a frame that could not be read and reports whether the
// connection goes on.
func (c *guestConn) frameError(f abi.Frame, err error) bool {
	if err == io.EOF || errors.Is(err, net.ErrClosed) {
		return false
	}
	if errors.Is(err, abi.ErrBudget) {
		return c.overBudget(f)
	}
	reason := frameErrorReason(err)
	c.e.metrics.FrameErrors.WithLabelValues(reason).Inc()
	c.log.Warn("dropping guest connection", "reason", reason, "err", err)
	if reason != "io" {
		op := f.Op
		if !op.Valid() {
			op = abi.OpReject
		}
		c.out = abi.AppendFrame(c.out[:0], op, abi.FlagReply, f.RequestID,
			abi.AppendReply(nil, abi.StatusBadFrame, err.Error(), nil))
		if c.reply(c.out, nil) {
			c.settle()
		}
	}
	return false
}

// overBudget refuses a frame whose payload could not be buffered within the
// node's budget (it was skipped); the connection goes on.
func (c *guestConn) overBudget(f abi.Frame) bool {
	err := guesterr.Refuse(guesterr.BufferBudget, abi.StatusUnavailable,
		"the node's request buffers are full (%d-byte budget): %d-byte %s refused; retry", c.e.cfg.RequestBufferBytes, f.Length, f.Op)
	c.e.metrics.Requests.WithLabelValues(f.Op.String(), abi.StatusUnavailable.String()).Inc()
	c.refused(f.Op, guesterr.BufferBudget, "bytes", f.Length)
	if f.Flags&abi.FlagAsync != 0 && c.sess != nil {
		c.sess.DeferError(f.Op, f.RequestID, err) // its stream is in the payload it did not read
		return true
	}
	c.out = abi.AppendFrameVersion(c.out[:0], f.Version, f.Op, abi.FlagReply, f.RequestID,
		abi.AppendReply(nil, abi.StatusUnavailable, err.Error(), nil))
	return c.reply(c.out, nil)
}

func frameErrorReason(err error) string {
	var ve *abi.VersionError
	var tl *abi.TooLargeError
	switch {
	case errors.Is(err, abi.ErrBadMagic):
		return "magic"
	case errors.As(err, &ve):
		return "version"
	case errors.As(err, &tl):
		return "too_large"
	case errors.Is(err, abi.ErrChecksum):
		return "checksum"
	case errors.Is(err, abi.ErrBadOpcode):
		return "opcode"
	case errors.Is(err, abi.ErrReserved):
		return "reserved"
	}
	return "io" // cut mid-frame or a socket error: nobody to reply to
}

// serve runs one request frame and queues its reply; false ends the
// connection.
func (c *guestConn) serve(f abi.Frame) bool {
	reply, err, end := c.dispatch(f)
	if end {
		if f.Op == abi.OpBye && c.sess != nil {
			c.goodbye(f)
		}
		return false
	}
	if f.InPlace != nil && f.InPlace.Err() != nil {
		return c.frameError(f, f.InPlace.Err()) // its data could not be read, or garbled
	}
	c.e.metrics.countRequest(&c.counted, f.Op, guesterr.StatusOf(err))
	if c.e.metrics.RequestBytes != nil {
		c.e.metrics.RequestBytes.Add(float64(abi.HeaderSize) + float64(f.Length))
	}
	if err != nil {
		c.noteFailure(f.Op, err)
	}
	if f.Flags&abi.FlagAsync != 0 && (err == nil || isDeferred(err)) {
		return true // no reply: the guest is pipelining; an error waits for its next sync
	}
	var held func() bool
	if c.status == nil { // a status reply tells of no state the standby must hold first
		held = c.e.node.ReplyGate(f.Op, err)
	}
	if f.Op == abi.OpHello && err == nil && opensSession(f.Payload) {
		held = c.answeringHello(held)
	}
	if held == nil && c.e.node.LeaseExpired() {
		// Its lease ran out: this reply could tell the guest of a change
		// the standby may never get. No reply; the guest resumes on the
		// standby. (A held reply checks when it may go: replies.go.)
		return false
	}
	st, msg := abi.StatusOK, ""
	if err != nil {
		st, msg = guesterr.StatusOf(err), err.Error()
		c.log.Debug("request refused", "op", f.Op, "status", st, "err", err)
	}
	// In the request's own ABI version: a guest of the previous version
	// is served too.
	var ok bool
	if data, large := reply.(*abi.DataReply); large && err == nil && len(data.Data) >= splitReplyMin {
		c.out = abi.AppendDataReplyFrameHead(c.out[:0], f.Version, f.Op, f.RequestID, data.Data)
		ok = c.replyParts(c.out, data.Data, held)
	} else {
		c.out = abi.AppendReplyFrame(c.out[:0], f.Version, f.Op, f.RequestID, st, msg, reply)
		ok = c.reply(c.out, held)
	}
	if data, ok := reply.(*abi.DataReply); ok && data.Release != nil {
		data.Release() // its bytes are written, or copied into c.out or a queued reply
	}
	if cap(c.out) > 1<<20 {
		c.out = nil // a large reply's buffer is not kept for the connection's life
	}
	return ok
}

// noteFailure counts and logs a request the node refused (err is not nil:
// the checks below cost an allocation each).
func (c *guestConn) noteFailure(op abi.Opcode, err error) {
	if reason := guesterr.Reason(err); reason != "" {
		c.refused(op, reason, "err", err)
	}
}

// isDeferred reports whether err is a pipelined request's error kept for
// the guest's next synchronization.
func isDeferred(err error) bool {
	var deferred guesterr.Deferred
	return errors.As(err, &deferred)
}

// refused counts a refused request and logs it (not every one: a guest
// must not be able to flood the node's log).
func (c *guestConn) refused(op abi.Opcode, reason string, args ...any) {
	c.e.metrics.Refusals.WithLabelValues(reason).Inc()
	c.refusals++
	if c.refusals <= 10 || c.refusals%1000 == 0 {
		c.log.Warn("guest request refused", append([]any{"op", op, "reason", reason, "refused_on_connection", c.refusals}, args...)...)
	}
}

// dispatch runs one request. A panic while it runs fails the request (and,
// if it changed state, the session), never the node.
func (c *guestConn) dispatch(f abi.Frame) (reply abi.Body, err error, end bool) {
	sess := c.sess // the session the request came to (none for a hello)
	defer func() {
		if p := recover(); p != nil { // a bug costs the request, never the node
			reply, err = c.e.node.Panicked(sess, f.Op, p, c.log)
		}
	}()
	switch {
	case f.Flags&abi.FlagReply != 0:
		return nil, guesterr.Fail(abi.StatusBadFrame, "guest sent a reply frame"), false
	case c.status != nil:
		return c.serveStatus(f)
	case c.sess == nil && f.Op == abi.OpStatusHello:
		c.status, reply, err = c.e.node.StatusHello(f.Payload, Peer{Version: f.Version, Tenant: c.tenant, Log: c.log})
		if c.status != nil {
			c.conn.SetReadDeadline(time.Time{}) // its frames stay small (helloMaxPayload)
			c.log.Info("guest status connection opened")
		}
		return reply, err, false
	case c.sess == nil && f.Op != abi.OpHello:
		return nil, guesterr.Fail(abi.StatusInvalidValue, "first request must be hello or status_hello, got %s", f.Op), false
	case f.Op == abi.OpBye && c.sess != nil:
		return nil, nil, true // goodbye
	case f.Op == abi.OpHello || f.Op == abi.OpStatusHello:
		if c.sess != nil {
			return nil, guesterr.Fail(abi.StatusInvalidValue, "session %d is already open on this connection", c.sess.ID()), false
		}
		start := time.Now()
		c.sess, reply, err = c.e.node.Hello(f.Payload, Peer{Version: f.Version, Tenant: c.tenant, Log: c.log})
		if c.sess != nil {
			c.opened(time.Since(start))
			c.upgrade()
		}
		return reply, err, false
	}
	start := time.Now()
	defer c.e.metrics.observeLatency(f.Op, start)
	reply, err = c.sess.Serve(c.request(f))
	return reply, err, false
}

// serveStatus runs one request of a status connection: a bye ends it;
// what is not about the device is refused, the connection going on.
func (c *guestConn) serveStatus(f abi.Frame) (reply abi.Body, err error, end bool) {
	switch f.Op {
	case abi.OpBye:
		return nil, nil, true
	case abi.OpHello, abi.OpStatusHello:
		return nil, guesterr.Fail(abi.StatusInvalidValue, "this is a status connection already: %s refused", f.Op), false
	}
	start := time.Now()
	defer c.e.metrics.observeLatency(f.Op, start)
	reply, err = c.status.Serve(f.Op, f.Payload)
	return reply, err, false
}

// request is frame f as its session runs it. Where a copy's bytes lie is
// decided here, at the connection's edge (Source): in the frame, in the
// shared ring (the frame reader left them there: abi.InPlace), or in the
// connection's host-memory region (hostmem.go).
func (c *guestConn) request(f abi.Frame) Request {
	r := Request{Op: f.Op, ID: f.RequestID, Async: f.Flags&abi.FlagAsync != 0, Payload: f.Payload, Sum: f.PayloadSum, Summed: f.PayloadSummed}
	switch {
	case f.InPlace != nil:
		r.Src = Ring{Data: f.InPlace}
	case f.Op == abi.OpCopyHtoDHost && c.host != nil:
		r.Src = Host{Region: c.host}
	}
	return r
}

// opened notes the session that hello opened or resumed on this
// connection; took is how long the node took to open it (for a new
// session, mostly its GPU context: a spare's, or one made meanwhile).
func (c *guestConn) opened(took time.Duration) {
	c.sess.Opened(mmiotrace.PeerPID(c.conn), c.host)
	c.log = c.log.With("session", c.sess.ID(), "guest", c.sess.Guest())
	c.log.Info("guest session opened", "window_base", fmt.Sprintf("%#x", c.sess.Base()), "gpu", c.sess.GPU(), "took", took.Round(time.Millisecond))
}
