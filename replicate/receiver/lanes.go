package receiver

import (
	"sync"

	"github.com/vgpuha/vgpuha/replicate"
)

// Lanes: applying different sessions' records side by side.
//
// A primary serving many guests logs their records interleaved, and one
// goroutine applying them in turn made every guest wait for all the
// others' applies: sixteen training programs on one H200 pair ran at a
// sixth of their speed unreplicated, the standby's applier the bottleneck
// (each of its records a call into that session's GPU context). With
// ReceiverConfig.ParallelSessions the applier hands each record whose
// kind is one session's alone (replicate.Op.SessionScoped) to that
// session's lane, a goroutine applying them in log order; a record of any
// other kind (a session opening or closing, a reset, an image, a verify,
// an epoch, a snapshot's) waits until every lane is idle and is applied
// by the applier itself, so it sees the log before it applied and the
// log after it waits for it. The applied position acked and reported is
// the last record before which every record was applied: never one a lane
// still holds.
//
// What this gives up: records of two sessions may be applied in another
// order than the primary ran them. Sessions share nothing a record
// changes (their own contexts, windows, handles and exactly-once tables);
// a device shared by their contexts could, close to full, refuse an
// allocation that the primary's order fit.

// maxInFlight bounds the records handed to lanes and not yet applied: the
// completion channel holds this many, so a lane never waits to report
// one. A lane's own queue holds laneQueue: the applier handing it one more
// waits for the lane, which waits for nothing of the applier's.
const (
	maxInFlight = applyQueue
	laneQueue   = 256
)

// lanes are a link's session lanes; only the applier's goroutine uses
// them (run is each lane's own).
type lanes struct {
	r      *Receiver
	on     bool
	open   map[uint64]chan applyItem // by session
	done   chan laneDone
	window inFlight
	wg     sync.WaitGroup
	idler  Idler // the Replica, if it holds work back (nil: it does not)
	// send writes a record's answer to the primary (a read check's need),
	// from the lane, before the lane reports the record applied.
	send func(*replicate.Record, answer)
}

// laneDone is a lane's record applied: its position, size and the lent
// buffer its body lay in.
type laneDone struct {
	seq  uint64
	size int
	buf  []byte
}

func newLanes(r *Receiver, send func(*replicate.Record, answer)) *lanes {
	ls := &lanes{r: r, on: r.cfg.ParallelSessions, open: map[uint64]chan applyItem{}, done: make(chan laneDone, maxInFlight), send: send}
	ls.idler, _ = r.cfg.Replica.(Idler)
	return ls
}

// takes reports whether rec goes to a lane: lanes are on, it is a live
// log record of one session's, and the mode applies records as they come
// (epoch mode buffers them).
func (ls *lanes) takes(rec *replicate.Record, mode replicate.Mode) bool {
	return ls.on && rec.Seq != 0 && rec.Session != 0 && mode != replicate.ModeEpoch && rec.Op.SessionScoped()
}

// after returns the last record handed out, or applied when none is in
// flight: the next record must follow it.
func (ls *lanes) after(applied uint64) uint64 {
	if ls.window.empty() {
		return applied
	}
	return ls.window.last()
}

// hand gives item to its session's lane, started on the session's first
// record; while maxInFlight are in flight it first takes completions
// (completed).
func (ls *lanes) hand(item applyItem, completed func(laneDone)) {
	for ls.window.len() >= maxInFlight {
		completed(<-ls.done)
	}
	ch := ls.open[item.rec.Session]
	if ch == nil {
		ch = make(chan applyItem, laneQueue)
		ls.open[item.rec.Session] = ch
		ls.wg.Add(1)
		go ls.run(ch)
	}
	ls.window.add(item.rec.Seq)
	ch <- item
}

// run is one session's lane. With nothing more queued, it tells an Idler.
func (ls *lanes) run(ch <-chan applyItem) {
	defer ls.wg.Done()
	for item := range ch {
		if item.rec.Op == replicate.OpReadCheck {
			typ, payload := ls.r.checkRead(&item.rec)
			ls.send(&item.rec, answer{typ: typ, payload: payload})
		} else {
			ls.r.apply(&item.rec)
		}
		if len(ch) == 0 {
			ls.idle(item.rec.Session)
		}
		ls.done <- laneDone{seq: item.rec.Seq, size: item.rec.Size(), buf: item.buf}
	}
}

// drain takes completions until no record is in flight.
func (ls *lanes) drain(completed func(laneDone)) {
	for !ls.window.empty() {
		completed(<-ls.done)
	}
}

// closing ends the lanes that rec, about to be applied with every lane
// idle, ends: its session's at its close, all at a reset.
func (ls *lanes) closing(rec *replicate.Record) {
	switch rec.Op {
	case replicate.OpSessionClose:
		if ch := ls.open[rec.Session]; ch != nil {
			close(ch)
			delete(ls.open, rec.Session)
		}
	case replicate.OpReset:
		ls.closeAll()
	}
}

func (ls *lanes) closeAll() {
	for id, ch := range ls.open {
		close(ch)
		delete(ls.open, id)
	}
}

// stop applies what is in flight, ends every lane and tells an Idler
// that every session is idle.
func (ls *lanes) stop(completed func(laneDone)) {
	ls.drain(completed)
	ls.closeAll()
	ls.wg.Wait()
	ls.idle(0)
}

// idle tells an Idler that session (0: every one) is idle.
func (ls *lanes) idle(session uint64) {
	if ls.idler != nil {
		ls.idler.Idle(session)
	}
}

// inFlight is the positions handed to lanes and not yet part of the
// applied position, in log order (consecutive), each with whether its
// record was applied.
type inFlight struct {
	first uint64 // position of done[0]
	done  []bool
}

func (w *inFlight) empty() bool  { return len(w.done) == 0 }
func (w *inFlight) len() int     { return len(w.done) }
func (w *inFlight) last() uint64 { return w.first + uint64(len(w.done)) - 1 }

// add notes position seq handed out (the one after last).
func (w *inFlight) add(seq uint64) {
	if w.empty() {
		w.first = seq
	}
	w.done = append(w.done, false)
}

// complete notes seq applied. It returns the new applied position when
// the records from first on are all applied now (and drops them).
func (w *inFlight) complete(seq uint64) (upTo uint64, moved bool) {
	w.done[seq-w.first] = true
	n := 0
	for n < len(w.done) && w.done[n] {
		n++
	}
	if n == 0 {
		return 0, false
	}
	upTo = w.first + uint64(n) - 1
	w.first += uint64(n)
	w.done = w.done[n:]
	return upTo, true
}
