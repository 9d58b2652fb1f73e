package pvdriver

// Failover: finding the node that serves the session once the one the
// guest talks to is gone or stuck, and moving there.
//
// A guest looks for a node in two cases. Its connection broke (the node
// died, or the link was cut): lost. Or a call has waited stallAfter while
// the connection stays open (the node is frozen, or cut off from its
// standby and holding its replies): the watchdog. Both look the same way
// (search): every candidate endpoint is asked at once, each in its own
// goroutine, to resume the session, and asked again every probeEvery
// until one accepts. A standby that was not promoted does not listen for
// guests, and a node takes a session only while nobody holds it, so
// asking is safe at any time and, before a takeover, costs a refused
// connection. Asking from the first moment of a stall, instead of after a
// call timeout, is what lets a guest on a frozen primary resume as soon as
// the standby serves, as one whose primary was killed does.
//
// Terms decide where a guest may go: it moves only to a node whose term is
// at least that of the node it was served by (a resume after a broken
// connection may return to the same node), and away from a stuck node only
// to one with a newer term. Terms only rise, so a slow but live primary
// never makes a guest flap: its standby does not serve (it refuses every
// probe) unless it took over under a newer term, and a guest moves once per
// takeover.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/pvdriver/transport"
)

// Failover describes one resume after a lost connection or a stall.
type Failover struct {
	// Lost is when the guest lost its node: the connection broke, or
	// (Stalled) the oldest call it gave up waiting for was made.
	Lost     time.Time
	Resumed  time.Time
	Endpoint string
	Term     uint64
	Resent   int
	// Stalled: the old node's connection was still open (a frozen or
	// partitioned node); the guest moved because a call waited.
	Stalled bool
	// Looks counts the rounds in which the guest asked the endpoints for
	// its session, the answering one included: more than one means it was
	// already looking when the new node began to serve, and resumed on
	// that node's first answer.
	Looks int
}

// stallAfter is how long a call may wait before the client looks for a
// node that took its session over; stallCheck is how often it checks.
// Well below a standby's detection time (about 270 ms), so the search is
// under way before a takeover can complete.
const (
	stallAfter = 50 * time.Millisecond
	stallCheck = stallAfter / 2
)

// probeEvery is how long a search waits between rounds, given how long it
// has been looking: briskly while a takeover may be under way (each ms is
// guest pause), then slower, so that a primary that is slow but alive
// costs its standby a few refused connections a second per waiting guest.
func probeEvery(looking time.Duration) time.Duration {
	switch {
	case looking < time.Second:
		return 5 * time.Millisecond
	case looking < 10*time.Second:
		return 50 * time.Millisecond
	}
	return 250 * time.Millisecond
}

// answer is one endpoint's reply to a search: a connection on which the
// session was resumed, or why not.
type answer struct {
	ep   string
	conn net.Conn
	hr   abi.HelloReply
	err  error
}

// search asks every endpoint in eps to resume the session, each at most
// once at a time, a round every probeEvery, until one takes it with a term
// of at least minTerm, until going on() says stop, or the client closes.
// It returns that answer and the rounds it took; a nil answer with the
// last refusal otherwise. Late answers are closed (the node keeps the
// session for a resume). A node under a term above sessionTerm that does
// not hold the session ends the search at once with ErrSessionLost (final).
func (c *Client) search(eps []string, minTerm, sessionTerm uint64, goOn func() bool) (*answer, int, error) {
	start := time.Now()
	answers := make(chan answer, len(eps))
	asking := map[string]bool{}
	defer func() { go closeLate(answers, len(asking)) }()
	var lastErr error
	for looks := 1; ; looks++ {
		for _, ep := range eps {
			if !asking[ep] {
				asking[ep] = true
				go func() {
					conn, hr, err := c.resumeOn(ep)
					answers <- answer{ep: ep, conn: conn, hr: hr, err: err}
				}()
			}
		}
		next := time.NewTimer(probeEvery(time.Since(start)))
		for waiting := true; waiting; {
			select {
			case a := <-answers:
				delete(asking, a.ep)
				if a.err == nil && a.hr.Term >= minTerm {
					next.Stop()
					return &a, looks, nil
				}
				if a.err == nil {
					a.conn.Close()
					a.err = fmt.Errorf("%s serves term %d, older than term %d the session needs", a.ep, a.hr.Term, minTerm)
				}
				lastErr = a.err
				if err := final(sessionTerm, a); err != nil {
					next.Stop()
					return nil, looks, err
				}
			case <-next.C:
				waiting = false
			case <-c.done:
				next.Stop()
				return nil, looks, ErrClosed
			}
		}
		if !goOn() {
			return nil, looks, lastErr
		}
	}
}

// final reports a session no search can find: a node under a term above
// the session's (sessionTerm) answered that it does not hold it. That node
// took over after the one that served the session (terms only rise), and
// the session never reached it: it was opened on a primary already
// deposed, whose records the new one refused.
func final(sessionTerm uint64, a answer) error {
	if !errors.Is(a.err, abi.StatusNoSession) || a.hr.Term <= sessionTerm {
		return nil
	}
	return fmt.Errorf("%w: %s serves term %d, above the session's term %d, and does not hold it (%v); the node that opened it was deposed",
		ErrSessionLost, a.ep, a.hr.Term, sessionTerm, a.err)
}

// closeLate closes the connections of the n answers a search no longer
// waits for.
func closeLate(answers <-chan answer, n int) {
	for range n {
		if a := <-answers; a.conn != nil {
			a.conn.Close()
		}
	}
}

// lost handles a broken connection of generation gen: resume elsewhere, or
// fail every call.
func (c *Client) lost(gen uint64, err error) {
	c.mu.Lock()
	if gen != c.gen || c.err != nil {
		c.mu.Unlock()
		return
	}
	c.gen++
	next := c.gen  // read under the lock: the watchdog bumps it too
	c.serving = "" // the watchdog leaves the search to resume
	c.wakeReaderLocked()
	c.conn.Close()
	c.unprotectApertures()
	// Before its hello was answered the guest has no session to resume
	// (a resume would open a second one; Open tries the next endpoint),
	// and after Close began it wants none.
	resumable := c.failover() && c.opened && !c.closing
	c.mu.Unlock()
	if !resumable {
		c.shutdown(fmt.Errorf("%w: %v", ErrClosed, err))
		return
	}
	go c.resume(next, err)
}

// resume finds a node holding the session (the one just lost included:
// a cut link leaves it serving), resumes it there, and hands the new
// connection to the writer, which resends the kept requests.
func (c *Client) resume(gen uint64, cause error) {
	lostAt := time.Now()
	deadline := lostAt.Add(c.opts.ResumeTimeout)
	c.mu.Lock()
	term := c.term
	c.mu.Unlock()
	current := func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return gen == c.gen && c.err == nil
	}
	a, looks, err := c.search(c.endpoints, term, term, func() bool { return current() && time.Now().Before(deadline) })
	if a == nil {
		switch {
		case !current():
		case errors.Is(err, ErrSessionLost):
			c.shutdown(fmt.Errorf("%w: session %d (term %d), %v after its connection broke: %w", ErrClosed, c.session, term,
				time.Since(lostAt).Round(time.Millisecond), err))
		default:
			if err == nil {
				err = cause
			}
			c.shutdown(fmt.Errorf("%w: no node resumed session %d within %v: %v", ErrClosed, c.session, c.opts.ResumeTimeout, err))
		}
		return
	}
	if !current() { // the watchdog moved the session meanwhile
		a.conn.Close()
		return
	}
	c.switchTo(gen, a, Failover{Lost: lostAt, Looks: looks})
}

// watchdog looks for a node that took the session over while a call is
// stalled: a frozen or partitioned node keeps its connection open, so only
// a node with a newer term accepting the session tells the guest to move.
func (c *Client) watchdog() {
	t := time.NewTicker(stallCheck)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
		}
		since, gen, term, eps := c.stalled()
		if since.IsZero() {
			continue
		}
		a, looks, err := c.search(eps, term+1, term, func() bool {
			s, g, _, _ := c.stalled()
			return !s.IsZero() && g == gen
		})
		switch {
		case a != nil:
			c.leaveStalled(gen, a, Failover{Lost: since, Stalled: true, Looks: looks})
		case errors.Is(err, ErrSessionLost):
			c.mu.Lock()
			current := gen == c.gen && c.err == nil
			c.mu.Unlock()
			if current { // what the deposed node still answers is lost with it
				c.shutdown(fmt.Errorf("%w: session %d (term %d): %w", ErrClosed, c.session, term, err))
			}
		}
	}
}

// stalled returns when the oldest call still waiting was made (or the write
// in progress began, if earlier), if that is
// more than stallAfter ago on a connection that is up (else zero), with
// the connection's generation, the term of the node serving it, and the
// other endpoints.
func (c *Client) stalled() (since time.Time, gen, term uint64, others []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.serving == "" || !c.opened || c.closing {
		return time.Time{}, 0, 0, nil
	}
	for _, at := range c.waiting {
		if since.IsZero() || at.Before(since) {
			since = at
		}
	}
	if w := c.writingSince.Load(); w != 0 && (since.IsZero() || w < since.UnixNano()) {
		since = time.Unix(0, w)
	}
	if since.IsZero() || time.Since(since) < stallAfter || c.err != nil {
		return time.Time{}, 0, 0, nil
	}
	for _, ep := range c.endpoints {
		if ep != c.serving {
			others = append(others, ep)
		}
	}
	return since, c.gen, c.term, others
}

// leaveStalled gives up the stalled connection of generation gen for a,
// unless the connection changed meanwhile.
func (c *Client) leaveStalled(gen uint64, a *answer, fo Failover) {
	c.mu.Lock()
	if gen != c.gen || c.err != nil {
		c.mu.Unlock()
		a.conn.Close()
		return
	}
	c.gen++
	next := c.gen
	old := c.conn
	c.unprotectApertures()
	c.wakeReaderLocked()
	c.mu.Unlock()
	old.Close()
	c.switchTo(next, a, fo)
}

// switchTo makes a's connection (where the session was just resumed) the
// client's connection of generation gen: reads start there and the writer
// resends the kept requests. fo says how the guest got there.
func (c *Client) switchTo(gen uint64, a *answer, fo Failover) {
	c.mu.Lock()
	if a.hr.Applied < c.forgotten {
		c.rollBackLocked(a)
	}
	c.conn, c.serving, c.term = a.conn, a.ep, a.hr.Term
	n := 0
	for _, k := range c.kept {
		if k.sent {
			n++
		}
	}
	fo.Resumed, fo.Endpoint, fo.Term, fo.Resent = time.Now(), a.ep, a.hr.Term, n
	c.failures = append(c.failures, fo)
	for id := range c.waiting {
		c.waiting[id] = time.Now()
	}
	c.mu.Unlock()
	go c.readLoop(a.conn, gen)
	select {
	case c.resumed <- bufio.NewWriterSize(a.conn, 256<<10):
	case <-c.done:
	}
}

// rollBackLocked handles a node that lacks changes the guest was told were
// done. A request that failed is not such a change: the node answers it
// too (the hello reply's Applied counts it), so a refused asynchronous
// request never reads as a rollback. It keeps the session (a restarted guest may take it over), but
// refuses to carry on as if nothing happened: every call fails until the
// guest accepts the rollback.
// Precondition: c.mu must be locked.
func (c *Client) rollBackLocked(a *answer) {
	c.rolledBack = fmt.Errorf("%w: %s holds the session only up to request %d, but request %d had completed (async or epoch replication, or the primary was unprotected)",
		ErrRolledBack, a.ep, a.hr.Applied, c.forgotten)
	c.rolledBackTo = a.hr.Applied
	c.kept = nil
	for id, ch := range c.pending {
		ch <- result{err: c.rolledBack}
		delete(c.pending, id)
		delete(c.waiting, id)
		c.abandoned[id] = true
	}
	// Requests queued before the rollback must not run on the new node
	// either. The writer is parked until it gets the new connection, so
	// nobody else reads the queue now.
	for len(c.sendq) > 0 {
		(<-c.sendq).release()
		c.queued.Add(-1)
	}
}

// resumeOn dials ep and resumes the session there.
func (c *Client) resumeOn(ep string) (net.Conn, abi.HelloReply, error) {
	var hr abi.HelloReply
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	conn, err := transport.DialWith(ctx, ep, c.host.memory())
	if err != nil {
		return nil, hr, err
	}
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	hello := abi.AppendBodyFrame(nil, abi.OpHello, 0, 0, &abi.Hello{GuestName: c.opts.GuestName, Resume: c.session, GraceMS: c.graceMS(), Token: c.token})
	if _, err := conn.Write(hello); err != nil {
		conn.Close()
		return nil, hr, err
	}
	f, err := abi.NewFrameReader(conn, 4096).ReadFrame()
	if err == nil {
		var st abi.Status
		var msg string
		st, msg, err = abi.DecodeReply(f.Payload, &hr)
		if err == nil && st != abi.StatusOK {
			err = &Error{Op: abi.OpHello, Status: st, Message: msg}
		}
	}
	if err == nil {
		err = c.reattach(conn)
	}
	if err != nil {
		conn.Close()
		return nil, hr, err
	}
	conn.SetDeadline(time.Time{})
	return conn, hr, nil
}

// reattach hands the apertures to the node the session resumed on, before
// anything else is sent there.
func (c *Client) reattach(conn net.Conn) error {
	c.mu.Lock()
	frames := c.reattachFrames()
	c.mu.Unlock()
	fr := abi.NewFrameReader(conn, 4096)
	for _, f := range frames {
		if _, err := conn.Write(f); err != nil {
			return err
		}
		reply, err := fr.ReadFrame()
		if err != nil {
			return err
		}
		st, msg, err := abi.DecodeReply(reply.Payload, &abi.ApertureReply{})
		if err == nil && st != abi.StatusOK {
			err = &Error{Op: abi.OpApertureAttach, Status: st, Message: msg}
		}
		if err != nil {
			return err
		}
	}
	return nil
}
