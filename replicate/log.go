package replicate

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vgpuha/vgpuha/replicate/internal/bufpool"
	"github.com/vgpuha/vgpuha/replicate/link"
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
// the ones some attached standby has not yet applied (bounded), and tells
// waiting guests when the standbys the commit rule counts have caught up.
//
// Each standby reads the log through its own cursor (one Sender each, see
// peers.go): a record is kept until every standby that holds a position in
// the log applied it. The commit rule waits for the sync set, the first k
// (SetMinInSync, default 1) caught-up standbys in priority order.
//
// While a standby of the sync set is attached (or the set is not full),
// Append blocks once that standby lags by MaxBytes: guests slow down
// instead of the log growing. A standby outside a full sync set that lags
// by more is dropped instead (it resyncs). A detached standby's position is
// kept until it lags by the bound, then dropped and it is resynced from a
// snapshot. While a standby resyncs, the log keeps everything after the
// snapshot's position within the resync budget: Append does not block
// while the log holds less than half of it for that standby, and past that
// it waits for the snapshot stream to earn the other half (in proportion
// to the bytes sent, streamAllowance), but at most the resync stall per
// record (SetResyncStall), so guests that write faster than the link are
// slowed a little at a time, each write by a bounded wait, instead of
// making the resync start over and over. At the whole budget Append waits
// for the stream; only a single record that does not fit in the budget
// drops that position and restarts the resync (ErrResyncBudget).
type Log struct {
	maxBytes int64
	// resyncBudget bounds what the log keeps while a resync streams
	// (with autoBudget, set from each snapshot's size: streamed);
	// resyncStall bounds one record's wait for a resync's stream to earn
	// it room (waitRoom).
	resyncBudget int64
	autoBudget   bool
	resyncStall  time.Duration
	// guestShare, when above 0, is the most of the link guests' writes
	// take while a standby joins (SetResyncGuestShare).
	guestShare float64
	// id names this log's lineage: a standby that applied records of
	// another log (an earlier primary process) must resync, not resume.
	id uint64

	mu       sync.Mutex
	cond     *sync.Cond
	term     uint64
	last     uint64  // last assigned sequence
	pending  []entry // (first-1, last], when retaining
	appended []time.Time
	first    uint64 // sequence of pending[0]
	// total counts the encoded bytes of every record retained so far;
	// base those released (through first-1): a cursor's lag in bytes is
	// total minus the running count at its position (lagOf).
	total, base int64
	retain      bool // pending is complete since first
	closed      bool
	epoch       uint64
	// peers are the standbys' cursors in priority order (peers.go).
	peers []*cursor
	// minInSync is k: the sync set's size when enough standbys are
	// caught up.
	minInSync int
	// departed names standbys that left the sync set while a coordinator
	// may still record them as in sync (recordDepartures): the commit
	// rule holds replies until Confirm clears them.
	departed         map[string]bool
	recordDepartures bool
	pool             bufpool.Pool
	// keeping mirrors retain for Append, which encodes a record before
	// it takes the lock (a 16 MiB copy must not hold up acks and the
	// sender).
	keeping atomic.Bool
	// sessionShare bounds each session's bytes the sync set does not
	// hold yet (fairness.go; 0: none); sessionBytes counts them, for the
	// records after recvSeq.
	sessionShare int64
	sessionBytes map[uint64]int64
	recvSeq      uint64
	// needs are the read checks a standby asked the bytes of, checkMin
	// the smallest read checked (readcheck.go).
	needs    readNeeds
	checkMin atomic.Int64
}

// entry is a record the log keeps, encoded once (AppendRecord) with room
// for the link's tag after it: the sender seals it straight from enc into
// its own buffer, so a record's bytes are copied once on the primary, when
// appended. Body aliases enc.
type entry struct {
	Record
	enc []byte
	end int64 // the log's total retained bytes through this entry
}

// newEntry encodes r into a buffer from pool (its Seq and Term are
// stamped later, by stamp).
func newEntry(pool *bufpool.Pool, r Record) entry {
	enc := AppendRecord(pool.Get(r.Size()+link.MacSize), &r)
	r.Body = enc[recordHeader:]
	return entry{Record: r, enc: enc}
}

// stamp sets the entry's sequence and term, in the record and its encoding.
func (e *entry) stamp(seq, term uint64) {
	e.Seq, e.Term = seq, term
	binary.LittleEndian.PutUint64(e.enc, seq)
	binary.LittleEndian.PutUint64(e.enc[8:], term)
}

// NewLog returns a log that holds at most maxBytes of unapplied records
// for a standby that counts (see Log).
func NewLog(maxBytes int64) *Log {
	var id [8]byte
	rand.Read(id[:])
	l := &Log{maxBytes: maxBytes, resyncBudget: max(maxBytes, DefaultResyncBudget), autoBudget: true, resyncStall: DefaultResyncStall, first: 1, id: binary.LittleEndian.Uint64(id[:]) | 1,
		minInSync: 1, departed: map[string]bool{}, sessionShare: DefaultSessionShare}
	l.pool.Max = int(min(maxBytes, poolMaxIdle))
	l.pool.Ahead = poolAhead
	l.cond = sync.NewCond(&l.mu)
	l.checkMin.Store(DefaultReadCheckMin)
	return l
}

// poolMaxIdle bounds the idle record buffers a log keeps for reuse;
// poolAhead is how many bytes of them a refill makes ready.
const (
	poolMaxIdle = 64 << 20
	poolAhead   = 32 << 20
)

// DefaultResyncBudget is the least resync budget of a new log; it grows to
// a resyncBudgetShare of each snapshot.
//
// Why a share of the snapshot: guests and the snapshot share the link, and
// the budget decides how much of it guests get. Measured on an H100 with
// primary and standby as processes of their own, 16 GiB of guest memory
// and a mixed workload writing about 1 GB/s: with 1 GiB the guests kept
// 0.29-0.32 of their call rate while the resync ran (8.5-8.9 s, longest
// call 40-60 ms); with 4 GiB, 0.67-0.70 (11.7-12.3 s, longest call 21-27
// ms). The cost is host memory on the primary, used only while guests
// write faster than the stream.
const DefaultResyncBudget = 1 << 30

// resyncBudgetShare: an automatic resync budget is a quarter of the
// snapshot's bytes (at least DefaultResyncBudget).
const resyncBudgetShare = 4

// SetResyncBudget bounds the records kept while a resync streams (at least
// the log's own bound); n <= 0 makes it automatic again (see
// DefaultResyncBudget).
func (l *Log) SetResyncBudget(n int64) {
	l.mu.Lock()
	l.autoBudget = n <= 0
	l.resyncBudget = max(n, l.maxBytes)
	if l.autoBudget {
		l.resyncBudget = max(l.maxBytes, DefaultResyncBudget)
	}
	l.mu.Unlock()
}

// DefaultResyncStall is the resync stall of a new log.
const DefaultResyncStall = 10 * time.Millisecond

// SetResyncStall bounds how long one record waits for a resync's snapshot
// stream to earn it room in the log (0: it never waits for that).
func (l *Log) SetResyncStall(d time.Duration) {
	l.mu.Lock()
	l.resyncStall = max(d, 0)
	l.mu.Unlock()
}

// SetResyncGuestShare bounds the share of the link that guests' writes
// take while a standby joins (0 < f < 1): while its snapshot streams they
// earn f/(1-f) bytes of log for each snapshot byte sent, after a first
// resyncBurst (each write waits at most the resync stall for it), and
// while it catches up they may add f of what it drains. f <= 0 goes back
// to the default rule: half the resync budget at once, the rest as the
// snapshot goes out, and half of what a catching-up standby drains.
func (l *Log) SetResyncGuestShare(f float64) {
	l.mu.Lock()
	l.guestShare = 0
	if f > 0 && f < 1 {
		l.guestShare = f
	}
	l.mu.Unlock()
}

// resyncBurst is what guests may write at once, with a guest share set,
// before the snapshot stream has earned them any room.
const resyncBurst = 32 << 20

// SetTerm sets the term stamped on new records.
func (l *Log) SetTerm(t uint64) {
	l.mu.Lock()
	l.term = t
	l.mu.Unlock()
}

// Append numbers r, keeps it for the standbys, and returns its sequence.
// It blocks while a standby that counts lags by more than the bound. r.Body
// is copied (before the log's lock is taken).
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
	l.waitRoom(r.Session, int64(r.Size()))
	l.last++
	seq := l.last
	if l.retain {
		if e.enc == nil { // the log began retaining meanwhile
			e = newEntry(&l.pool, r)
		}
		e.stamp(seq, l.term)
		l.total += int64(e.Size())
		e.end = l.total
		l.pending = append(l.pending, e)
		l.appended = append(l.appended, time.Now())
		l.noteSessionBytes(r.Session, seq, int64(e.Size()))
		l.bound()
	}
	l.cond.Broadcast()
	return seq
}

// waitRoom blocks while Append of size bytes of session must wait
// (mustWait, and the session's share: fairness.go). A wait
// for a resync's snapshot to earn the room lasts at most the resync stall:
// then the record goes in, and only the resync budget bounds the log. So
// a guest's write waits a bounded time (set by configuration, whatever the
// memory size) while a resync streams, and guests that write faster than
// the snapshot goes out are slowed by at most that much per record.
// Precondition: l.mu must be locked.
func (l *Log) waitRoom(session uint64, size int64) {
	var timer *time.Timer
	expired := false
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		switch l.mustWait(size) {
		case roomFree:
			if !l.overShare(session, size) {
				return
			}
		case roomEarned:
			if expired || l.resyncStall <= 0 {
				return
			}
			if timer == nil {
				timer = time.AfterFunc(l.resyncStall, func() {
					l.mu.Lock()
					expired = true
					l.cond.Broadcast()
					l.mu.Unlock()
				})
			}
		}
		l.cond.Wait()
	}
}

// Precondition: l.mu must be locked.
func (l *Log) setRetain(on bool) {
	l.retain = on
	l.keeping.Store(on)
}

// Precondition: l.mu must be locked.
func (l *Log) dropPending() {
	l.pending, l.appended, l.base = nil, nil, l.total
	l.first = l.last + 1
}

// Last is the sequence of the newest record.
func (l *Log) Last() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.last
}

// WaitApplied blocks until every standby of the sync set has applied seq,
// or the set is empty (the primary is then unprotected and guests must not
// stall). It reports whether seq is known applied by a non-empty sync set
// that no standby left unconfirmed (see Confirm).
func (l *Log) WaitApplied(seq uint64) bool {
	return l.waitSet(seq, func(c *cursor) uint64 { return c.acked })
}

// WaitReceived is WaitApplied for the commit rule: it waits until the sync
// set holds seq, applied or queued to apply. A standby applies all it
// holds before it serves (a promotion drains its queue), so a guest told
// of seq never loses it to a failover; and one guest's long kernel on a
// standby does not hold back another guest's replies.
func (l *Log) WaitReceived(seq uint64) bool {
	return l.waitSet(seq, func(c *cursor) uint64 { return c.received })
}

func (l *Log) waitSet(seq uint64, pos func(*cursor) uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for !l.closed && l.setLacks(seq, pos) {
		l.cond.Wait()
	}
	return !l.setLacks(seq, pos) && l.setSize() > 0 && len(l.departed) == 0
}

// BeginSnapshot is called with every session stopped: every standby about
// to be resynced takes the current position, the log retains everything
// appended from now on, and it returns the sequence the snapshot stands
// for.
func (l *Log) BeginSnapshot() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.retain {
		l.dropPending()
		l.setRetain(true)
	}
	for _, c := range l.peers {
		if c.attached && c.snapshotPending {
			c.snapshotTaken(l.last)
		}
	}
	l.settle()
	return l.last
}

// snapshotSent: the whole snapshot is on c's link. The standby protects
// the primary once it has applied what the log holds now and lags by
// less than catchUpBytes (guests then never wait for a long backlog);
// until then Append blocks only past the catch-up bound, which applies
// once the standby has applied the snapshot.
func (l *Log) snapshotSent(c *cursor) {
	l.mu.Lock()
	c.resyncAt, c.sentAll = l.last, true
	l.cond.Broadcast() // guests may use the whole budget now
	l.mu.Unlock()
}

// resyncOverBudget reports whether the log dropped what c's resync under
// way needs.
func (l *Log) resyncOverBudget(c *cursor) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return c.overBudget
}

// catchUpBytes: a resyncing standby protects once it lags by less than
// this (or the log's bound, if smaller).
const catchUpBytes = 4 << 20

// CutEpoch records the end of an epoch and returns its number, once the
// sync set holds the cut (so the epoch is committed on both sides);
// durable is false when no standby is protecting the primary.
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

// resume attaches c's standby that applied through seq of the log named
// logID, if it can catch up from what the log holds; otherwise it reports
// false and the standby must resync.
func (l *Log) resume(c *cursor, logID, seq uint64) bool {
	l.mu.Lock()
	ok := logID == l.id && l.retain && seq+1 >= l.first && seq <= l.last
	l.mu.Unlock()
	if ok {
		l.attach(c, true, seq, false)
	}
	return ok
}

// ack records that c's standby holds through received and applied through
// seq, and releases what no standby needs any more (the log keeps what is
// not applied: a standby that restarts resumes from what it applied).
func (l *Log) ack(c *cursor, received, seq uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	received, seq = min(received, l.last), min(seq, l.last)
	c.received = max(c.received, received, seq)
	held := l.lagOf(c)
	c.acked = max(c.acked, seq)
	switch {
	case c.streaming && c.sentAll && seq >= c.snapshotAt:
		c.streaming, c.catchUpLimit = false, l.lagOf(c) // the snapshot is applied: catch up
	case c.resyncing && !c.streaming:
		// Guests get their share of what the standby drained (half by
		// default): the lag shrinks.
		drained := held - l.lagOf(c)
		keep := drained / 2
		if l.guestShare > 0 {
			keep = int64(float64(drained) * l.guestShare)
		}
		c.catchUpLimit = max(l.maxBytes, c.catchUpLimit-(drained-keep))
	}
	l.protect(c, seq)
	l.settle()
}

// protect makes c protecting once it applied through its resync point
// and, resyncing, lags by less than catchUpBytes.
// Precondition: l.mu must be locked.
func (l *Log) protect(c *cursor, seq uint64) {
	if seq < c.resyncAt || !c.attached || c.protected || c.dropped {
		return
	}
	if c.resyncing && l.lagOf(c) > min(catchUpBytes, l.maxBytes) {
		c.resyncAt = l.last // still catching up: another round
		return
	}
	c.protected, c.resyncing = true, false
}

// next waits for records after seq and returns them, as many as fit in
// maxBytes but at least one (nil when the log is closed, c was dropped or
// the link is being torn down).
func (l *Log) next(c *cursor, after uint64, stop <-chan struct{}, maxBytes int) []entry {
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.last <= after && !l.closed && !c.dropped {
		select {
		case <-stop:
			return nil
		default:
		}
		l.cond.Wait()
	}
	return l.takeLocked(c, after, maxBytes)
}

// ready is next without the wait: the records after seq the log holds
// now (nil when there are none).
func (l *Log) ready(c *cursor, after uint64, maxBytes int) []entry {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.takeLocked(c, after, maxBytes)
}

// takeLocked returns the records after seq, as many as fit in maxBytes
// but at least one (nil when there are none, the log is closed or c was
// dropped).
// Precondition: l.mu must be locked.
func (l *Log) takeLocked(c *cursor, after uint64, maxBytes int) []entry {
	i := int(after + 1 - l.first)
	if l.closed || c.dropped || after+1 < l.first || i >= len(l.pending) {
		return nil
	}
	j, n := i+1, l.pending[i].Size()
	for j < len(l.pending) && n+l.pending[j].Size() <= maxBytes {
		n += l.pending[j].Size()
		j++
	}
	return append([]entry(nil), l.pending[i:j]...)
}

// sentThrough tells the log that c's sender is done with every entry up
// to seq.
func (l *Log) sentThrough(c *cursor, seq uint64) {
	l.mu.Lock()
	c.sent = max(c.sent, seq)
	l.mu.Unlock()
}

// attach marks c's link up (resuming at applied, or resyncing when
// applied is older than what the log holds) or down.
func (l *Log) attach(c *cursor, up bool, applied uint64, resync bool) {
	l.mu.Lock()
	c.attach(up, applied, resync)
	l.settle()
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

// LogStatus describes the log, or one standby's position in it, for
// /status and metrics.
type LogStatus struct {
	Last       uint64  `json:"last_seq"`
	Applied    uint64  `json:"applied_seq"`
	LagOps     uint64  `json:"lag_ops"`
	LagBytes   int64   `json:"lag_bytes"`
	LagSeconds float64 `json:"lag_seconds"`
	Attached   bool    `json:"standby_attached"`
	// Protected: the log as a whole: the sync set is full (k standbys);
	// one standby's: it is caught up.
	Protected bool `json:"protected"`
	// InSync: the standby is in the sync set and holds every reply the
	// commit rule let out (a coordinator may record it as in sync); the
	// log as a whole: InSyncCount reaches MinInSync.
	InSync      bool   `json:"in_sync"`
	InSyncCount int    `json:"in_sync_count"`
	MinInSync   int    `json:"min_in_sync"`
	Epoch       uint64 `json:"epoch"`
}

// Status reports the log's position and the sync set's lag: Applied is
// what its slowest standby applied (without one, the slowest standby
// that holds a position).
func (l *Log) Status() LogStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := LogStatus{Last: l.last, Applied: l.last, LagBytes: l.total - l.base, Epoch: l.epoch, MinInSync: l.minInSync}
	for _, c := range l.peers {
		st.Attached = st.Attached || c.attached
		if c.inSync() {
			st.InSyncCount++
		}
	}
	st.Applied = l.slowest()
	st.LagOps = l.last - st.Applied
	st.Protected = l.setSize() >= l.minInSync
	st.InSync = st.InSyncCount >= l.minInSync
	if len(l.appended) > 0 && st.Attached {
		st.LagSeconds = time.Since(l.appended[0]).Seconds()
	}
	return st
}
