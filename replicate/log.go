package replicate

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Mode is a replication mode: what a guest's reply waits for.
type Mode int

// Modes.
const (
	// ModeSync: every synchronous call returns after the standby applied it.
	ModeSync Mode = iota
	// ModeCommit: ops stream without waiting; a reply that carries anything
	// out to the guest (data, a handle, an address, an error, a sync) waits
	// until the standby has applied every op before it.
	ModeCommit
	// ModeAsync: nothing waits; the standby lags by at most the log bound.
	ModeAsync
	// ModeEpoch: the standby applies an epoch only once the primary cuts
	// the next one (for an external VM checkpointer).
	ModeEpoch
)

var modeNames = map[Mode]string{ModeSync: "sync", ModeCommit: "commit", ModeAsync: "async", ModeEpoch: "epoch"}

func (m Mode) String() string { return modeNames[m] }

// ParseMode parses a --mode flag.
func ParseMode(s string) (Mode, error) {
	for m, n := range modeNames {
		if n == s {
			return m, nil
		}
	}
	return 0, fmt.Errorf("unknown replication mode %q (want sync, commit, async or epoch)", s)
}

// Log is the primary's operation log: it numbers every state change, keeps
// the ones the standby has not yet applied (bounded), and tells waiting
// guests when the standby has caught up.
//
// While a standby is attached, Append blocks once MaxBytes of unapplied
// records are held: guests slow down instead of the log growing. While none
// is attached, the log keeps records only until the bound is reached, then
// drops them and the next standby is resynced from a snapshot. While a
// standby resyncs, Append never blocks: the log keeps everything after the
// snapshot's position up to the resync budget, past which it drops it and
// the resync starts over (ErrResyncBudget).
type Log struct {
	maxBytes int64
	// resyncBudget bounds what the log keeps while a resync streams.
	resyncBudget int64
	// id names this log's lineage: a standby that applied records of
	// another log (an earlier primary process) must resync, not resume.
	id uint64

	mu       sync.Mutex
	cond     *sync.Cond
	term     uint64
	last     uint64  // last assigned sequence
	acked    uint64  // last sequence the standby applied
	received uint64  // last sequence the standby holds (applied or queued to apply)
	pending  []entry // (first-1, last], when retaining
	appended []time.Time
	first    uint64 // sequence of pending[0]
	bytes    int64  // encoded bytes in pending
	retain   bool   // pending is complete since first
	attached bool   // a standby link is up: records are kept, Append may block
	// protected: the attached standby holds everything up to resyncAt, so
	// waiting for its acks is meaningful. A resyncing standby is attached
	// but not yet protecting; guests are not held up for it.
	protected bool
	resyncAt  uint64
	// snapshotPending: a resync is about to stop every session to take a
	// snapshot, so Append must not block (a blocked session would hold the
	// lock the snapshot needs).
	snapshotPending bool
	// resyncing: a resync is under way (from attach until the standby
	// protects). streaming: its snapshot is on the link or not yet
	// applied (the standby reads up to maxLentBytes ahead of what it
	// applies); meanwhile Append does not block, the resync budget
	// applies. Once the standby applied the snapshot (through snapshotAt,
	// after snapshotSent), the log may not grow past what it held then
	// (catchUpLimit, at least maxBytes), and each ack lowers that bound
	// by half of what the standby drained: it catches up instead of
	// chasing the guests, and guests slow down gradually, never all at
	// once, and never wait on a standby still applying the snapshot.
	resyncing    bool
	streaming    bool
	sentAll      bool
	snapshotAt   uint64
	catchUpLimit int64
	// overBudget: the log dropped what a resync under way needed.
	overBudget bool
	closed     bool
	epoch      uint64
	// sent: the sender is done with every entry up to sent (it sealed
	// them onto the link); an acked entry's buffer goes back to pool only
	// then.
	sent uint64
	pool bufPool
	// keeping mirrors retain for Append, which encodes a record before
	// it takes the lock (a 16 MiB copy must not hold up acks and the
	// sender).
	keeping atomic.Bool
}

// entry is a record the log keeps, encoded once (AppendRecord) with room
// for the link's tag after it: the sender seals it straight from enc into
// its own buffer, so a record's bytes are copied once on the primary, when
// appended. Body aliases enc.
type entry struct {
	Record
	enc []byte
}

// newEntry encodes r into a buffer from pool (its Seq and Term are
// stamped later, by stamp).
func newEntry(pool *bufPool, r Record) entry {
	enc := AppendRecord(pool.get(r.Size()+macSize), &r)
	r.Body = enc[recordHeader:]
	return entry{Record: r, enc: enc}
}

// stamp sets the entry's sequence and term, in the record and its encoding.
func (e *entry) stamp(seq, term uint64) {
	e.Seq, e.Term = seq, term
	binary.LittleEndian.PutUint64(e.enc, seq)
	binary.LittleEndian.PutUint64(e.enc[8:], term)
}

// NewLog returns a log that holds at most maxBytes of unapplied records.
func NewLog(maxBytes int64) *Log {
	var id [8]byte
	rand.Read(id[:])
	l := &Log{maxBytes: maxBytes, resyncBudget: max(maxBytes, DefaultResyncBudget), first: 1, id: binary.LittleEndian.Uint64(id[:]) | 1}
	l.pool.max = int(min(maxBytes, poolMaxIdle))
	l.cond = sync.NewCond(&l.mu)
	return l
}

// poolMaxIdle bounds the idle record buffers a log keeps for reuse.
const poolMaxIdle = 64 << 20

// DefaultResyncBudget is the resync budget of a new log.
const DefaultResyncBudget = 1 << 30

// SetResyncBudget bounds the records kept while a resync streams (at least
// the log's own bound).
func (l *Log) SetResyncBudget(n int64) {
	l.mu.Lock()
	l.resyncBudget = max(n, l.maxBytes)
	l.mu.Unlock()
}

// SetTerm sets the term stamped on new records.
func (l *Log) SetTerm(t uint64) {
	l.mu.Lock()
	l.term = t
	l.mu.Unlock()
}

// Append numbers r, keeps it for the standby, and returns its sequence. It
// blocks while an attached standby lags by more than the bound. r.Body is
// copied (before the log's lock is taken).
func (l *Log) Append(r Record) uint64 {
	var e entry
	if l.keeping.Load() {
		e = newEntry(&l.pool, r)
	}
	return l.add(r, e)
}

// add numbers r and keeps it, as e (r encoded; empty: encoded here if the
// log retains records now).
func (l *Log) add(r Record, e entry) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.attached && !l.snapshotPending && !l.streaming && l.bytes > l.limit() && !l.closed {
		l.cond.Wait()
	}
	l.last++
	seq := l.last
	if l.retain {
		if e.enc == nil { // the log began retaining meanwhile
			e = newEntry(&l.pool, r)
		}
		e.stamp(seq, l.term)
		l.pending = append(l.pending, e)
		l.appended = append(l.appended, time.Now())
		l.bytes += int64(e.Size())
		switch {
		case !l.attached && l.bytes > l.maxBytes:
			l.dropPending() // the standby is gone too long: it will resync
			l.setRetain(false)
		case l.streaming && l.bytes > l.resyncBudget:
			l.dropPending() // the resync under way starts over
			l.setRetain(false)
			l.overBudget = true
		}
	}
	l.cond.Broadcast()
	return seq
}

// Precondition: l.mu must be locked.
func (l *Log) setRetain(on bool) {
	l.retain = on
	l.keeping.Store(on)
}

// limit is what the log holds before Append blocks.
// Precondition: l.mu must be locked.
func (l *Log) limit() int64 {
	if l.resyncing {
		return max(l.maxBytes, l.catchUpLimit)
	}
	return l.maxBytes
}

// Precondition: l.mu must be locked.
func (l *Log) dropPending() {
	l.pending, l.appended, l.bytes = nil, nil, 0
	l.first = l.last + 1
}

// Last is the sequence of the newest record.
func (l *Log) Last() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.last
}

// WaitApplied blocks until the standby has applied seq, or no standby is
// attached (the primary is then unprotected and guests must not stall). It
// reports whether seq is known applied.
func (l *Log) WaitApplied(seq uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.protected && l.acked < seq && !l.closed {
		l.cond.Wait()
	}
	return l.acked >= seq
}

// WaitReceived is WaitApplied for the commit rule: it waits until the
// standby holds seq, applied or queued to apply. A standby applies all it
// holds before it serves (a promotion drains its queue), so a guest told
// of seq never loses it to a failover; and one guest's long kernel on the
// standby does not hold back another guest's replies.
func (l *Log) WaitReceived(seq uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.protected && l.received < seq && !l.closed {
		l.cond.Wait()
	}
	return l.received >= seq
}

// BeginSnapshot is called with every session stopped: it drops what the log
// holds, retains everything appended from now on, and returns the sequence
// the snapshot stands for.
func (l *Log) BeginSnapshot() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dropPending()
	l.setRetain(true)
	l.protected = false
	l.snapshotPending = false
	l.overBudget = false
	l.resyncAt, l.snapshotAt, l.sentAll = l.last, l.last, false
	return l.last
}

// snapshotSent: the whole snapshot is on the link. The standby protects
// the primary once it has applied what the log holds now and lags by
// less than catchUpBytes (guests then never wait for a long backlog);
// until then Append blocks only past the catch-up bound, which applies
// once the standby has applied the snapshot.
func (l *Log) snapshotSent() {
	l.mu.Lock()
	l.resyncAt, l.sentAll = l.last, true
	l.mu.Unlock()
}

// resyncOverBudget reports whether the log dropped what the resync under
// way needs.
func (l *Log) resyncOverBudget() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.overBudget
}

// catchUpBytes: a resyncing standby protects once it lags by less than
// this (or the log's bound, if smaller).
const catchUpBytes = 4 << 20

// CutEpoch records the end of an epoch and returns its number, once the
// standby holds the cut (so the epoch is committed on both sides); durable
// is false when no standby is protecting the primary.
func (l *Log) CutEpoch() (epoch uint64, durable bool) {
	l.mu.Lock()
	l.epoch++
	e := l.epoch
	l.mu.Unlock()
	seq := l.Append(Record{Op: OpEpoch, Result: e})
	return e, l.WaitApplied(seq)
}

// Close wakes every waiter for good.
func (l *Log) Close() {
	l.mu.Lock()
	l.closed = true
	l.cond.Broadcast()
	l.mu.Unlock()
}

// resume attaches a standby that applied through seq of the log named
// logID, if it can catch up from what the log holds; otherwise it reports
// false and the standby must resync.
func (l *Log) resume(logID, seq uint64) bool {
	l.mu.Lock()
	ok := logID == l.id && l.retain && seq+1 >= l.first && seq <= l.last
	l.mu.Unlock()
	if ok {
		l.attach(true, seq, false)
	}
	return ok
}

// ack records that the standby holds through received and applied through
// seq, and releases what it no longer needs (the log keeps what is not
// applied: a standby that restarts resumes from what it applied).
func (l *Log) ack(received, seq uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	received, seq = min(received, l.last), min(seq, l.last)
	l.received = max(l.received, received, seq)
	defer l.cond.Broadcast()
	held := l.bytes
	if seq > l.acked {
		l.acked = seq
		n := 0
		for n < len(l.pending) && l.pending[n].Seq <= seq {
			e := &l.pending[n]
			l.bytes -= int64(e.Size())
			if e.Seq <= l.sent {
				l.pool.put(e.enc)
			}
			*e = entry{}
			n++
		}
		l.pending = l.pending[n:]
		l.appended = l.appended[n:]
		l.first += uint64(n)
	}
	switch {
	case l.streaming && l.sentAll && seq >= l.snapshotAt:
		l.streaming, l.catchUpLimit = false, l.bytes // the snapshot is applied: catch up
	case l.resyncing && !l.streaming:
		// Guests get half of what the standby drained: the lag shrinks.
		l.catchUpLimit = max(l.maxBytes, l.catchUpLimit-(held-l.bytes)/2)
	}
	if seq < l.resyncAt || !l.attached || l.protected {
		return
	}
	if l.resyncing && l.bytes > min(catchUpBytes, l.maxBytes) {
		l.resyncAt = l.last // still catching up: another round
		return
	}
	l.protected, l.resyncing = true, false
}

// next waits for records after seq and returns them, as many as fit in
// maxBytes but at least one (nil when the log is closed or the link is
// being torn down).
func (l *Log) next(after uint64, stop <-chan struct{}, maxBytes int) []entry {
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.last <= after && !l.closed {
		select {
		case <-stop:
			return nil
		default:
		}
		l.cond.Wait()
	}
	i := int(after + 1 - l.first)
	if l.closed || after+1 < l.first || i >= len(l.pending) {
		return nil
	}
	j, n := i+1, l.pending[i].Size()
	for j < len(l.pending) && n+l.pending[j].Size() <= maxBytes {
		n += l.pending[j].Size()
		j++
	}
	return append([]entry(nil), l.pending[i:j]...)
}

// sentThrough tells the log that the sender is done with every entry up
// to seq.
func (l *Log) sentThrough(seq uint64) {
	l.mu.Lock()
	l.sent = max(l.sent, seq)
	l.mu.Unlock()
}

// attach marks a standby link up (resuming at applied, or resyncing when
// applied is older than what the log holds) or down.
func (l *Log) attach(up bool, applied uint64, resync bool) {
	l.mu.Lock()
	l.attached = up
	l.protected = false
	l.snapshotPending = up && resync
	l.resyncing, l.streaming, l.sentAll = up && resync, up && resync, false
	l.overBudget = false
	l.sent = 0 // a new link's sender has sent nothing yet
	if up {
		l.acked, l.received = applied, applied
		l.resyncAt = applied
	}
	l.cond.Broadcast()
	l.mu.Unlock()
}

// wake makes a sender blocked in next look at its stop channel.
func (l *Log) wake() {
	l.mu.Lock()
	l.cond.Broadcast()
	l.mu.Unlock()
}

// Closed reports whether the log was closed (its node is going down).
func (l *Log) Closed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// LogStatus describes the log for /status and metrics.
type LogStatus struct {
	Last       uint64  `json:"last_seq"`
	Applied    uint64  `json:"applied_seq"`
	LagOps     uint64  `json:"lag_ops"`
	LagBytes   int64   `json:"lag_bytes"`
	LagSeconds float64 `json:"lag_seconds"`
	Attached   bool    `json:"standby_attached"`
	Protected  bool    `json:"protected"`
	Epoch      uint64  `json:"epoch"`
}

// Status reports the log's position and the standby's lag.
func (l *Log) Status() LogStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := LogStatus{Last: l.last, Applied: l.acked, LagOps: l.last - l.acked, LagBytes: l.bytes, Attached: l.attached, Protected: l.protected, Epoch: l.epoch}
	if len(l.appended) > 0 && l.attached {
		st.LagSeconds = time.Since(l.appended[0]).Seconds()
	}
	return st
}
