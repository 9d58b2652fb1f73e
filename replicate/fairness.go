package replicate

// Fairness between guests in the log.
//
// The link is one ordered stream, and the commit rule makes a reply wait
// until the sync set holds every record before it: a guest that writes
// (or reads: each read is a read-back record) as fast as it can would
// otherwise fill the log up to its bound, and every other guest's reply
// would wait behind all of it (issue 47: other guests' median latency
// ×6 with one reader, ×45 with three). So each session may have at most
// its share of bytes in the log that the sync set does not hold yet
// (SetSessionShare): past it, that session's next record waits for its
// own backlog to reach the standby, and the other sessions' records go
// in behind at most one share per busy session, not behind the whole log.
// A record larger than the share goes in alone (the session's backlog
// drained first); the hypervisor cuts large read-backs and guest writes
// into pieces (Piece) so that none is large (a guest write's pieces but
// the last carry no request id: FlagPieces). Nothing is reordered: each
// session's records keep their order (and the log its one sequence), so
// exactly-once and per-guest order are untouched.
//
// The share binds only while a standby of the sync set is attached (an
// unprotected primary never stalls a guest for it), never while a
// snapshot is being taken, and never for records of no session (control
// records).

// DefaultSessionShare is a new log's session share: the largest that kept
// other guests' p99 within 2x of idle beside a guest reading or writing
// flat out (vgpuha-lab bench fairness, 2-core VM: 1.9x at 256 KiB on
// loopback and on a 200 MiB/s link, 3.5x at 1 MiB on loopback;
// docs/PERFORMANCE.md). It still covers a fast link's bytes in flight
// over an ack's round trip (about 2.6 GB/s at 100 µs) for one guest alone;
// a slower or distant link may want more.
const DefaultSessionShare = 256 << 10

// SetSessionShare bounds the bytes of one session's records the log holds
// that the sync set has not received (n <= 0: no bound; a session may fill
// the log up to its own bound).
func (l *Log) SetSessionShare(n int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sessionShare = max(n, 0)
	l.rebuildSessionBytes(l.setReceived())
	l.cond.Broadcast()
}

// SessionShare is the bound SetSessionShare set (0: none).
func (l *Log) SessionShare() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sessionShare
}

// Piece is the most bytes a writer of records that may be cut (the
// hypervisor's read-backs and guest writes) should put in one, so that a
// busy session keeps a few pieces in flight within its share: a quarter
// of the share, at least 4 KiB; 0 (no bound) when sessions do not share
// the log, or no standby of the sync set is attached (then nobody waits
// for the share, and a resync's budget sees each write whole).
func (l *Log) Piece() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sessionShare <= 0 || l.setSize() == 0 {
		return 0
	}
	return int(max(l.sessionShare/4, 4096))
}

// overShare reports whether a record of size bytes of session must wait
// for that session's backlog: its share is bound (see the file comment),
// and the session has records in flight that, with this one, pass it.
// Precondition: l.mu must be locked.
func (l *Log) overShare(session uint64, size int64) bool {
	if l.sessionShare <= 0 || session == 0 || l.closed || !l.retain || l.setSize() == 0 || l.snapshotPending() {
		return false
	}
	held := l.sessionBytes[session]
	return held > 0 && held+size > l.sessionShare
}

// noteSessionBytes counts a record just kept (seq, size bytes) against
// its session's share.
// Precondition: l.mu must be locked.
func (l *Log) noteSessionBytes(session, seq uint64, size int64) {
	if l.sessionShare <= 0 || session == 0 {
		return
	}
	if l.setSize() == 0 { // nobody to wait for: nothing in flight
		l.recvSeq = seq
		return
	}
	if l.sessionBytes == nil {
		l.sessionBytes = map[uint64]int64{}
	}
	l.sessionBytes[session] += size
}

// setReceived is the position through which every standby of the sync set
// holds the log (the newest record without one).
// Precondition: l.mu must be locked.
func (l *Log) setReceived() uint64 {
	to, found := l.last, false
	for _, c := range l.peers {
		if c.inSet {
			to, found = min(to, c.received), true
		}
	}
	if !found {
		return l.last
	}
	return to
}

// accountReceived takes off the sessions' shares what the sync set now
// holds. It runs before the log releases records (settle): the records it
// walks are still there.
// Precondition: l.mu must be locked.
func (l *Log) accountReceived() {
	if l.sessionShare <= 0 {
		return
	}
	to := l.setReceived()
	switch {
	case to == l.recvSeq:
		return
	case to < l.recvSeq || l.recvSeq+1 < l.first: // the set changed, or records went unseen
		l.rebuildSessionBytes(to)
		return
	}
	for seq := l.recvSeq + 1; seq <= to; seq++ {
		i := int(seq - l.first)
		if i >= len(l.pending) {
			break
		}
		e := &l.pending[i]
		if e.Session == 0 {
			continue
		}
		if l.sessionBytes[e.Session] -= int64(e.Size()); l.sessionBytes[e.Session] <= 0 {
			delete(l.sessionBytes, e.Session)
		}
	}
	l.recvSeq = to
}

// rebuildSessionBytes counts every session's records after position to
// afresh.
// Precondition: l.mu must be locked.
func (l *Log) rebuildSessionBytes(to uint64) {
	clear(l.sessionBytes)
	l.recvSeq = to
	if l.sessionShare <= 0 || !l.retain {
		return
	}
	if l.sessionBytes == nil {
		l.sessionBytes = map[uint64]int64{}
	}
	for i := range l.pending {
		if e := &l.pending[i]; e.Seq > to && e.Session != 0 {
			l.sessionBytes[e.Session] += int64(e.Size())
		}
	}
}
