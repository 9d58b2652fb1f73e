package receiver

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"time"

	"github.com/vgpuha/vgpuha/replicate"
	"github.com/vgpuha/vgpuha/replicate/link"
)

// Applying on the standby: the applier goroutine, the buffers it holds
// for a Settler replica's queued work, and what each record does to the
// replica and the receiver's positions.

// applier applies queued records in order until the queue is closed. A
// protocol violation (a gap) ends the link; what follows it is dropped.
// It asks for an ack whenever it caught up, and every ackEveryBytes of
// log records applied while it works through a backlog: the primary's log
// releases (and its waiting guests go on) as the standby applies, not
// once per AckInterval. A replica that queues copies (Settler) keeps the
// buffers they read until it settled them (see settling). With
// ParallelSessions, each session's records go to its lane (lanes.go).
func (lr *linkRun) applier(done chan<- struct{}) {
	defer close(done)
	a := &applying{lr: lr, held: newSettling(lr.r), lanes: newLanes(lr.r, lr.send)}
	defer a.held.settle()
	defer a.lanes.stop(a.completed)
	for {
		ev, ok := a.held.next(lr.queue, a.lanes.done)
		switch {
		case !ok:
			return
		case ev.fromLane:
			a.completed(ev.lane)
		default:
			a.take(ev.item)
		}
	}
}

// applying is the applier's state: the buffers it holds, its lanes, how
// many bytes it applied since it last asked for an ack, and whether the
// link broke (what follows is dropped).
type applying struct {
	lr       *linkRun
	held     *settling
	lanes    *lanes
	sinceAck int
	broken   bool
}

// take applies (or hands to its session's lane) one record read off the
// link, in log order.
func (a *applying) take(item applyItem) {
	r := a.lr.r
	if a.broken {
		a.held.add(item.buf)
		return
	}
	r.mu.Lock()
	mode, applied := r.mode, r.applied
	r.mu.Unlock()
	if a.lanes.takes(&item.rec, mode) {
		if want := a.lanes.after(applied) + 1; item.rec.Seq != want {
			a.breakLink(fmt.Errorf("record %d after %d: the stream has a gap", item.rec.Seq, want-1))
			a.held.add(item.buf)
			return
		}
		a.lanes.hand(item, a.completed)
		return
	}
	a.lanes.drain(a.completed) // what follows sees every record before it applied
	a.lanes.closing(&item.rec)
	out, err := r.handle(&item.rec)
	if err != nil {
		a.breakLink(err)
	} else {
		a.lr.send(&item.rec, out)
	}
	if err == nil && out.live {
		// After the answer: an ack that covers a read check follows its need.
		r.mu.Lock()
		r.applied = item.rec.Seq
		r.mu.Unlock()
	}
	if len(a.lr.queue) == 0 {
		a.lanes.idle(0) // records applied here (lanes off, epoch mode) may have left work held
	}
	a.counted(item.rec.Seq, item.rec.Size(), item.buf)
}

// completed notes a lane's record applied: the applied position moves
// over every record before which all were applied.
func (a *applying) completed(d laneDone) {
	if upTo, ok := a.lanes.window.complete(d.seq); ok {
		a.lr.r.mu.Lock()
		a.lr.r.applied = upTo
		a.lr.r.mu.Unlock()
	}
	a.counted(d.seq, d.size, d.buf)
}

// counted asks for an ack once the applier caught up or applied
// ackEveryBytes since the last, and holds buf (after the ack: queued work
// counts as applied).
func (a *applying) counted(seq uint64, size int, buf []byte) {
	if seq != 0 {
		a.sinceAck += size
	}
	idle := len(a.lr.queue) == 0 && a.lanes.window.empty()
	if idle || a.sinceAck >= ackEveryBytes {
		a.sinceAck = 0
		select {
		case a.lr.kick <- struct{}{}:
		default:
		}
	}
	a.held.add(buf)
	if size >= lendAbove {
		runtime.Gosched() // a large apply lets others on this host run (a guest on a shared one)
	}
}

// send writes the answer to rec, if it has one. A link that broke is
// noticed by its reader; what it brought is still applied (a promotion
// applies all the standby holds), and a reply that waited for this answer
// never went out.
func (lr *linkRun) send(rec *replicate.Record, out answer) {
	if out.payload == nil {
		return
	}
	if err := lr.l.WriteFlush(out.typ, out.payload); err != nil {
		lr.log.Debug("answer not sent", "op", rec.Op, "seq", rec.Seq, "err", err)
	}
}

func (a *applying) breakLink(err error) {
	a.lr.log.Warn("dropping link", "err", err)
	a.broken = true
	a.lr.l.Raw.Close()
}

// Settler is an Applier whose Apply may leave device work queued that
// still reads the record's body (a copy from the page-locked buffer it
// arrived in). The receiver keeps those buffers unchanged until the work
// is settled: it marks the work every settleEveryBytes of buffers and
// settles the mark before the last, so the device works through one run
// of records while the applier queues the next; once no record came for
// settleIdle, it settles all. A Settle error means queued work failed:
// the replica may differ from the primary (counted and logged as a
// failed apply).
type Settler interface {
	// Mark notes how far the queued work has come.
	Mark() uint64
	// Settle returns once no work queued before Mark returned upTo (or
	// an earlier mark) reads a record's body.
	Settle(upTo uint64) error
}

// settleEveryBytes is the receive buffers in one marked run of a
// Settler's queued work; the applier holds at most two runs (well below
// maxLentBytes, so the link keeps reading while they wait).
const settleEveryBytes = 32 << 20

// settleIdle is how long the applier, caught up, waits for the next
// record before it settles all it holds (and gives the buffers back).
// Settling at once each time it caught up had it wait for the device
// after nearly every record while a standby caught up over a fast link
// (37% of its time, measured on the H200 host), since records then come
// a little slower than it applies them.
const settleIdle = time.Millisecond

// settling holds the lent buffers of records applied since the replica
// last settled their queued work; a replica that queues none gets each
// back at once.
type settling struct {
	r       *Receiver
	run     [][]byte // buffers since the last mark
	bytes   int      // in run
	marked  [][]byte // buffers of the last mark's run, not yet settled
	mark    uint64   // that mark
	settler Settler  // nil: the replica queues nothing
	idle    *time.Timer
}

func newSettling(r *Receiver) *settling {
	s := &settling{r: r}
	s.settler, _ = r.cfg.Replica.(Settler)
	return s
}

// event is what the applier waits for: a record read off the link, or
// a lane's record applied.
type event struct {
	item     applyItem
	lane     laneDone
	fromLane bool
}

// next returns the next record to apply or lane's record applied (false
// once the queue is closed). While the queue is empty and buffers are
// held, it settles them if nothing comes within settleIdle: held buffers
// then never keep the link's reader waiting for long for a buffer to
// read into.
func (s *settling) next(queue <-chan applyItem, lanes <-chan laneDone) (event, bool) {
	var idle <-chan time.Time
	if len(s.run)+len(s.marked) > 0 && len(queue) == 0 {
		if s.idle == nil {
			s.idle = time.NewTimer(settleIdle)
		} else {
			s.idle.Reset(settleIdle)
		}
		idle = s.idle.C
		defer s.idle.Stop()
	}
	for {
		select {
		case item, ok := <-queue:
			return event{item: item}, ok
		case d := <-lanes:
			return event{lane: d, fromLane: true}, true
		case <-idle:
			s.settle()
			idle = nil
		}
	}
}

// add holds buffer buf (nil: none) until the work that reads it is
// settled.
func (s *settling) add(buf []byte) {
	switch {
	case buf == nil:
	case s.settler == nil:
		s.r.lender.Give(buf)
	default:
		s.run, s.bytes = append(s.run, buf), s.bytes+cap(buf)
	}
	if s.bytes >= settleEveryBytes {
		if len(s.marked) > 0 { // the run before: the device has likely done it
			s.wait(s.mark)
			s.give(s.marked)
		}
		s.mark = s.settler.Mark()
		s.marked, s.run, s.bytes = s.run, s.marked[:0], 0
	}
}

// settle waits for all the replica's queued work and gives every buffer
// back.
func (s *settling) settle() {
	if len(s.run)+len(s.marked) == 0 {
		return
	}
	s.wait(s.settler.Mark())
	s.give(s.marked)
	s.give(s.run)
	s.marked, s.run, s.bytes = s.marked[:0], s.run[:0], 0
}

// wait settles the replica's work up to mark; a failure is counted and
// logged as a failed apply.
func (s *settling) wait(mark uint64) {
	if err := s.settler.Settle(mark); err != nil {
		s.r.mu.Lock()
		s.r.st.ApplyErrors++
		s.r.mu.Unlock()
		s.r.cfg.Logger.Warn("replica diverged: queued work failed", "err", err)
	}
}

func (s *settling) give(bufs [][]byte) {
	for i, buf := range bufs {
		s.r.lender.Give(buf)
		bufs[i] = nil
	}
}

// answer is what handle did with a record: a message the standby sends
// the primary about it (payload nil: none), and whether it was a live
// record, the applied position's next.
type answer struct {
	typ     uint16
	payload []byte
	live    bool
}

// handle applies or buffers one record. It returns an answer to send (a
// verify reply, a read check's need), or an error that ends the link (a
// protocol violation, never a failed apply). The caller moves the applied
// position to a live record once its answer went out.
func (r *Receiver) handle(rec *replicate.Record) (answer, error) {
	r.mu.Lock()
	mode, applied := r.mode, r.applied
	r.mu.Unlock()
	switch {
	case rec.Op == replicate.OpReset:
		r.reset(rec)
		return answer{}, nil
	case rec.Seq == 0: // part of a snapshot
		r.snapshotRecord(rec)
		return answer{}, nil
	case rec.Seq != applied+1:
		return answer{}, fmt.Errorf("record %d after %d: the stream has a gap", rec.Seq, applied)
	}
	reply := answer{live: true}
	switch {
	case rec.Op == replicate.OpVerify:
		reply.typ, reply.payload = link.MsgVerifyReply, replicate.EncodeSums(rec.Result, r.cfg.Replica.Checksums())
	case rec.Op == replicate.OpReadCheck:
		reply.typ, reply.payload = r.checkRead(rec)
	case mode == replicate.ModeEpoch && rec.Op == replicate.OpEpoch:
		r.mu.Lock()
		buf := r.epochBuf
		r.epochBuf = nil
		r.mu.Unlock()
		for i := range buf {
			r.apply(&buf[i])
		}
	case mode == replicate.ModeEpoch:
		cp := *rec
		cp.Body = append([]byte(nil), rec.Body...)
		r.mu.Lock()
		r.epochBuf = append(r.epochBuf, cp)
		r.mu.Unlock()
	default:
		r.apply(rec)
	}
	return reply, nil
}

// ReadChecker is an Applier that compares a read check
// (replicate.OpReadCheck) with its own bytes. Without one, every check
// asks for the bytes.
type ReadChecker interface {
	// ReadMatches reports whether this replica holds, where the check
	// names, bytes of the checksum the guest's had (false where it cannot
	// tell).
	ReadMatches(rec *replicate.Record) bool
}

// checkRead applies a read check: nothing to answer where the replica's
// bytes are the ones the guest read, else the need for them
// (link.MsgReadNeed, the check's position). The answer must go out before
// the applied position passes the check.
func (r *Receiver) checkRead(rec *replicate.Record) (typ uint16, payload []byte) {
	rc, ok := r.cfg.Replica.(ReadChecker)
	start := time.Now()
	match := ok && rc.ReadMatches(rec)
	if r.cfg.Observe != nil {
		r.cfg.Observe(rec.Op, time.Since(start))
	}
	if match {
		return 0, nil
	}
	return link.MsgReadNeed, binary.LittleEndian.AppendUint64(nil, rec.Seq)
}

// reset starts a resync: the replica is dropped and rebuilt from the
// snapshot that follows.
func (r *Receiver) reset(rec *replicate.Record) {
	r.apply(rec)
	r.mu.Lock()
	// The log's id is claimed only at the snapshot's end: a standby cut
	// off mid-snapshot must resync again, never resume from a log whose
	// start (a promoted primary's log begins at 0) it has not applied.
	r.logID, r.resyncLog, r.applied, r.epochBuf = 0, rec.Result, 0, nil
	r.st.Resyncing, r.st.SnapshotRecords, r.st.InSync = true, 0, false
	r.mu.Unlock()
	r.cfg.Replica.Synced(false)
	total := replicate.ResetTotal(rec.Body)
	r.progress.Begin(total)
	r.cfg.Logger.Info("resync started: replica reset; not in sync until the snapshot ends", "bytes", total)
}

// snapshotRecord applies one record of a snapshot, or ends it.
func (r *Receiver) snapshotRecord(rec *replicate.Record) {
	if rec.Op == replicate.OpSnapshotEnd {
		r.mu.Lock()
		r.logID, r.applied, r.st.Resyncing, r.st.InSync = r.resyncLog, rec.Result, false, true
		n := r.st.SnapshotRecords
		r.mu.Unlock()
		r.progress.End()
		r.cfg.Replica.Synced(true)
		r.cfg.Logger.Info("resync snapshot applied; in sync, catching up from the log", "records", n, "position", rec.Result)
		return
	}
	r.apply(rec)
	r.mu.Lock()
	r.st.SnapshotRecords++
	n := r.st.SnapshotRecords
	r.mu.Unlock()
	if r.progress.Add(uint64(len(rec.Body))) {
		r.cfg.Logger.Info("resync in progress", append(r.progress.Status().LogArgs(), "snapshot_records", n)...)
	}
}

func (r *Receiver) apply(rec *replicate.Record) {
	start := time.Now()
	err := r.cfg.Replica.Apply(rec)
	if r.cfg.Observe != nil {
		r.cfg.Observe(rec.Op, time.Since(start))
	}
	if err != nil {
		r.mu.Lock()
		r.st.ApplyErrors++
		r.mu.Unlock()
		r.cfg.Logger.Warn("replica diverged", "seq", rec.Seq, "session", rec.Session, "op", rec.Op, "err", err)
	}
}
