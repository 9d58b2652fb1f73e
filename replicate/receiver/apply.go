package receiver

import (
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
// buffers they read until it settled them (see settling).
func (lr *linkRun) applier(done chan<- struct{}) {
	defer close(done)
	held := newSettling(lr.r)
	defer held.settle()
	broken := false
	sinceAck := 0
	for {
		item, ok := held.next(lr.queue)
		if !ok {
			return
		}
		if !broken {
			reply, err := lr.r.handle(&item.rec)
			switch {
			case err != nil:
				lr.log.Warn("dropping link", "err", err)
				broken = true
				lr.l.Raw.Close()
			case reply != nil && lr.l.WriteFlush(link.MsgVerifyReply, reply) != nil:
				broken = true
			}
		}
		idle := len(lr.queue) == 0
		if item.rec.Seq != 0 {
			sinceAck += item.rec.Size()
		}
		if idle || sinceAck >= ackEveryBytes {
			sinceAck = 0
			select {
			case lr.kick <- struct{}{}:
			default:
			}
		}
		held.add(item.buf) // after the ack: queued work counts as applied
		if len(item.rec.Body) >= lendAbove {
			runtime.Gosched() // a large apply lets others on this host run (a guest on a shared one)
		}
	}
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

// next returns the next record to apply (false once the queue is
// closed). While the queue is empty and buffers are held, it settles
// them if no record comes within settleIdle: held buffers then never keep
// the link's reader waiting for long for a buffer to read into.
func (s *settling) next(queue <-chan applyItem) (applyItem, bool) {
	if len(s.run)+len(s.marked) > 0 && len(queue) == 0 {
		if s.idle == nil {
			s.idle = time.NewTimer(settleIdle)
		} else {
			s.idle.Reset(settleIdle)
		}
		select {
		case item, ok := <-queue:
			s.idle.Stop()
			return item, ok
		case <-s.idle.C:
			s.settle()
		}
	}
	item, ok := <-queue
	return item, ok
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

// handle applies or buffers one record. It returns a verify reply to send,
// or an error that ends the link (a protocol violation, never a failed
// apply).
func (r *Receiver) handle(rec *replicate.Record) ([]byte, error) {
	r.mu.Lock()
	mode, applied := r.mode, r.applied
	r.mu.Unlock()
	switch {
	case rec.Op == replicate.OpReset:
		r.reset(rec)
		return nil, nil
	case rec.Seq == 0: // part of a snapshot
		r.snapshotRecord(rec)
		return nil, nil
	case rec.Seq != applied+1:
		return nil, fmt.Errorf("record %d after %d: the stream has a gap", rec.Seq, applied)
	}
	var reply []byte
	switch {
	case rec.Op == replicate.OpVerify:
		reply = replicate.EncodeSums(rec.Result, r.cfg.Replica.Checksums())
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
	r.mu.Lock()
	r.applied = rec.Seq
	r.mu.Unlock()
	return reply, nil
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
