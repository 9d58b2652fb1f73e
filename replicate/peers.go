package replicate

import (
	"math"
	"slices"
	"time"
)

// This file holds the log's standbys: one cursor per standby (each read by
// its own Sender), the sync set the commit rule waits for, and what the log
// keeps for whom.
//
// The sync set is the first k caught-up standbys in priority order (the
// order their senders were added: --replication.standbys, then standbys
// taken from a pool), like PostgreSQL's synchronous_standby_names FIRST k
// and Patroni's synchronous_node_count: a reply that must wait (the mode's
// rule) waits until every standby in the set holds it. A caught-up
// standby beyond k streams too but is not waited for, and a failover may
// not pick it.
//
// Fewer than k caught up: replies wait for the ones there are (the set
// shrinks, down to none: unprotected), because a primary whose standby is
// slow or gone must go on serving; the pool refills the set (Patroni's
// non-strict synchronous mode). Without a coordinator that happens at once,
// as with one standby. With one (RecordDepartures), the set may only shrink
// on record: a standby that left it may still be named in etcd as in sync
// and campaign, so every reply that must wait is held until the node has
// rewritten the group's record without it (Confirm); a standby is named in
// sync only once it is in the set and holds everything the log held when
// it joined (cursor.inSync): every reply let out before it joined is
// below that, every reply after waited for it.

// cursor is one standby's position in the log and its link's phase.
type cursor struct {
	name      string
	attached  bool
	protected bool   // caught up: it may join the sync set
	acked     uint64 // last sequence it applied
	received  uint64 // last sequence it holds (applied or queued to apply)
	resyncAt  uint64
	// snapshotPending: a resync is about to stop every session to take a
	// snapshot, so Append must not block (a blocked session would hold
	// the lock the snapshot needs).
	snapshotPending bool
	// resyncing: a resync is under way (from attach until the standby
	// protects). streaming: its snapshot is on the link or not yet
	// applied (the standby reads up to maxLentBytes ahead of what it
	// applies); meanwhile Append does not block for it, the resync budget
	// applies. Once the standby applied the snapshot (through snapshotAt,
	// after sentAll), the log may not grow past what it held then
	// (catchUpLimit, at least maxBytes), and each ack lowers that bound
	// by half of what the standby drained: it catches up instead of
	// chasing the guests, and guests slow down gradually, never all at
	// once, and never wait on a standby still applying the snapshot.
	resyncing    bool
	streaming    bool
	sentAll      bool
	snapshotAt   uint64
	catchUpLimit int64
	// streamDone of streamTotal snapshot bytes are on the link (the
	// sender's streamed): they earn guests their share of the resync
	// budget (streamAllowance).
	streamDone, streamTotal uint64
	// overBudget: the log dropped what a resync under way needed.
	overBudget bool
	// dropped: the log keeps nothing for this standby (never attached,
	// resyncing before its snapshot, or fallen behind the bound): it
	// holds back no release, and its sender must end the link.
	dropped bool
	// sent: the sender is done with every entry up to sent (it sealed
	// them onto the link); an entry's buffer goes back to the pool only
	// once every attached sender is done with it.
	sent uint64
	// inSet: in the sync set since the log's position setFrom.
	inSet   bool
	setFrom uint64
}

// inSync: in the sync set and holding every reply let out before it
// joined (see the file comment).
func (c *cursor) inSync() bool { return c.inSet && c.received >= c.setFrom }

func (c *cursor) attach(up bool, applied uint64, resync bool) {
	c.attached = up
	c.protected = false
	c.snapshotPending = up && resync
	c.resyncing, c.streaming, c.sentAll = up && resync, up && resync, false
	c.overBudget = false
	if up {
		c.dropped = resync // holds nothing until its snapshot's position
		c.acked, c.received, c.resyncAt, c.sent = applied, applied, applied, applied
	}
}

// snapshotTaken: the snapshot for c's resync stands for position at.
func (c *cursor) snapshotTaken(at uint64) {
	c.snapshotPending, c.dropped, c.overBudget, c.protected = false, false, false, false
	c.acked, c.received, c.sent = at, at, at
	c.resyncAt, c.snapshotAt, c.sentAll = at, at, false
	c.streamDone, c.streamTotal = 0, 0
}

// addCursor adds a standby, last in priority.
func (l *Log) addCursor(name string) *cursor {
	c := &cursor{name: name, dropped: true}
	l.mu.Lock()
	l.peers = append(l.peers, c)
	l.mu.Unlock()
	return c
}

// removeCursor takes a standby's cursor away for good (its sender stopped).
func (l *Log) removeCursor(c *cursor) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.peers = slices.DeleteFunc(l.peers, func(p *cursor) bool { return p == c })
	if c.inSet {
		l.leaveSet(c)
	}
	l.settle()
}

// SetMinInSync sets k, the number of caught-up standbys the commit rule
// waits for (at least 1).
func (l *Log) SetMinInSync(k int) {
	l.mu.Lock()
	l.minInSync = max(k, 1)
	l.settle()
	l.mu.Unlock()
}

// RecordDepartures makes a standby that leaves the sync set hold back
// replies until Confirm (a coordinated primary: see the file comment).
func (l *Log) RecordDepartures() {
	l.mu.Lock()
	l.recordDepartures = true
	l.mu.Unlock()
}

// Confirm tells the log that the group's record now names exactly
// inSync as in sync: every standby that left the sync set and is not
// among them no longer holds replies back.
func (l *Log) Confirm(inSync []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for name := range l.departed {
		if !slices.Contains(inSync, name) {
			delete(l.departed, name)
		}
	}
	l.cond.Broadcast()
}

// Unconfirmed lists the standbys that left the sync set and may still be
// recorded as in sync.
func (l *Log) Unconfirmed() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for name := range l.departed {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// Precondition: l.mu must be locked.
func (l *Log) leaveSet(c *cursor) {
	c.inSet = false
	if l.recordDepartures {
		l.departed[c.name] = true
	}
}

// settle brings the sync set and what the log keeps up to date after any
// change of a cursor, and wakes every waiter.
// Precondition: l.mu must be locked.
func (l *Log) settle() {
	n := 0
	for _, c := range l.peers {
		if c.inSet && (!c.attached || c.dropped || !c.protected) {
			l.leaveSet(c)
		}
		if c.inSet {
			n++
		}
	}
	for _, c := range l.peers {
		if n < l.minInSync && !c.inSet && c.attached && c.protected && !c.dropped {
			c.inSet, c.setFrom = true, l.last
			n++
		}
		if c.inSync() { // it holds every reply let out while it was away
			delete(l.departed, c.name)
		}
	}
	l.accountReceived()
	l.release()
	l.cond.Broadcast()
}

// setSize is the number of standbys in the sync set.
// Precondition: l.mu must be locked.
func (l *Log) setSize() int {
	n := 0
	for _, c := range l.peers {
		if c.inSet {
			n++
		}
	}
	return n
}

// setLacks reports whether a standby of the sync set lacks seq (by pos).
// Precondition: l.mu must be locked.
func (l *Log) setLacks(seq uint64, pos func(*cursor) uint64) bool {
	for _, c := range l.peers {
		if c.inSet && pos(c) < seq {
			return true
		}
	}
	return false
}

// counts reports whether Append waits for c: it is in the sync set, or
// the set is not full (c may join it).
// Precondition: l.mu must be locked.
func (l *Log) counts(c *cursor) bool { return c.inSet || l.setSize() < l.minInSync }

// lagOf is the bytes the log holds after c's position.
// Precondition: l.mu must be locked.
func (l *Log) lagOf(c *cursor) int64 {
	if i := int64(c.acked) - int64(l.first); i >= 0 && i < int64(len(l.pending)) {
		return l.total - l.pending[i].end
	}
	return l.total - l.base // at or before what the log holds
}

// limit is what the log holds for c before Append blocks (or, for a
// standby that does not count, before it is dropped).
// Precondition: l.mu must be locked.
func (l *Log) limit(c *cursor) int64 {
	if c.resyncing {
		return max(l.maxBytes, c.catchUpLimit)
	}
	return l.maxBytes
}

// room says whether Append may go on now, or what it waits for.
type room int

const (
	roomFree room = iota
	// roomEarned: a resync's snapshot has not yet earned the room
	// (streamAllowance); Append waits for it at most the resync stall.
	roomEarned
	// roomFull: a standby that counts lags past its limit, or a resync
	// would outgrow its budget; Append waits until it drains.
	roomFull
)

// mustWait reports whether (and for what) Append of size bytes must wait:
// a standby that counts lags past its limit, or a resync's snapshot has
// not yet earned the room; never while a snapshot is being taken.
// Precondition: l.mu must be locked.
func (l *Log) mustWait(size int64) room {
	if l.closed || l.snapshotPending() {
		return roomFree
	}
	why := roomFree
	for _, c := range l.peers {
		if !c.attached || c.dropped {
			continue
		}
		lag := l.lagOf(c)
		switch {
		case !c.streaming && l.counts(c) && lag > l.limit(c),
			c.streaming && lag > 0 && size <= l.resyncBudget && lag+size > l.resyncBudget:
			return roomFull
		case c.streaming && lag > 0 && size <= l.resyncBudget && lag+size > l.streamAllowance(c):
			why = roomEarned
		}
	}
	return why
}

// snapshotPending reports whether a resync is about to take a snapshot:
// Append must not block (a blocked session would hold the lock the
// snapshot needs).
// Precondition: l.mu must be locked.
func (l *Log) snapshotPending() bool {
	for _, c := range l.peers {
		if c.attached && c.snapshotPending {
			return true
		}
	}
	return false
}

// streamAllowance is what the log may hold for c while its snapshot
// streams: half the resync budget at once, the other half as the
// snapshot's bytes go out, all of it once they all did; with a guest
// share, resyncBurst at once and then the share's part of each byte sent.
// Guests that write faster than the link are slowed a little at a time
// instead of making the resync start over and over (with a steady writer,
// for ever).
// Precondition: l.mu must be locked.
func (l *Log) streamAllowance(c *cursor) int64 {
	half := l.resyncBudget / 2
	switch {
	case c.sentAll:
		return l.resyncBudget
	case l.guestShare > 0:
		earned := float64(c.streamDone) * l.guestShare / (1 - l.guestShare)
		return min(l.resyncBudget, min(half, resyncBurst)+int64(min(earned, math.MaxInt64/4)))
	case c.streamTotal == 0:
		return half
	}
	return half + int64(float64(l.resyncBudget-half)*float64(c.streamDone)/float64(c.streamTotal))
}

// streamed: done of total bytes of c's snapshot are on the link. An
// automatic resync budget grows to its share of the snapshot.
func (l *Log) streamed(c *cursor, done, total uint64) {
	l.mu.Lock()
	c.streamDone, c.streamTotal = done, total
	if l.autoBudget {
		l.resyncBudget = max(l.resyncBudget, int64(min(total/resyncBudgetShare, math.MaxInt64/2)))
	}
	l.cond.Broadcast()
	l.mu.Unlock()
}

// bound drops the position of every standby the log may no longer keep
// records for: a resync over its budget (it starts over), a detached
// standby past the bound and a standby that does not count past its
// limit (both resync).
// Precondition: l.mu must be locked.
func (l *Log) bound() {
	changed := false
	for _, c := range l.peers {
		if c.dropped {
			continue
		}
		lag := l.lagOf(c)
		switch {
		case c.attached && c.streaming && lag > l.resyncBudget:
			c.overBudget, c.dropped = true, true
		case !c.attached && lag > l.maxBytes,
			c.attached && !c.streaming && !l.counts(c) && lag > l.limit(c):
			c.dropped = true
		default:
			continue
		}
		changed = true
	}
	if changed {
		l.settle()
	}
}

// slowest is the position of the sync set's slowest standby; without a
// set, of the slowest standby the log keeps records for; without one, the
// position before what the log holds.
// Precondition: l.mu must be locked.
func (l *Log) slowest() uint64 {
	for _, inSet := range []bool{true, false} {
		pos, found := l.last, false
		for _, c := range l.peers {
			if inSet && c.inSet || !inSet && !c.dropped {
				pos, found = min(pos, c.acked), true
			}
		}
		if found {
			return pos
		}
	}
	return l.first - 1
}

// release drops every record that each standby the log keeps records for
// has applied; with none, it stops retaining.
// Precondition: l.mu must be locked.
func (l *Log) release() {
	floor, holding := l.last, false
	for _, c := range l.peers {
		if !c.dropped {
			floor, holding = min(floor, c.acked), true
		}
	}
	if !holding {
		if l.retain {
			l.dropPending()
			l.setRetain(false)
		}
		return
	}
	n := 0
	for n < len(l.pending) && l.pending[n].Seq <= floor {
		e := &l.pending[n]
		if l.allSent(e.Seq) {
			l.pool.Put(e.enc)
		}
		l.base = e.end
		*e = entry{}
		n++
	}
	l.pending = l.pending[n:]
	l.appended = l.appended[n:]
	l.first += uint64(n)
}

// allSent reports whether every attached sender is done with seq.
// Precondition: l.mu must be locked.
func (l *Log) allSent(seq uint64) bool {
	for _, c := range l.peers {
		if c.attached && c.sent < seq {
			return false
		}
	}
	return true
}

// peerStatus is c's position in the log.
func (l *Log) peerStatus(c *cursor) LogStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := LogStatus{Last: l.last, Applied: min(c.acked, l.last), Attached: c.attached, Protected: c.protected,
		InSync: c.inSync(), Epoch: l.epoch, MinInSync: l.minInSync}
	if st.InSync {
		st.InSyncCount = 1
	}
	st.LagOps = l.last - st.Applied
	if !c.dropped {
		st.LagBytes = l.lagOf(c)
		if i := int(c.acked + 1 - l.first); c.attached && i >= 0 && i < len(l.appended) {
			st.LagSeconds = time.Since(l.appended[i]).Seconds()
		}
	}
	return st
}
