package replicate

import (
	"encoding/binary"
	"fmt"
	"sync"
)

// Read checks: a guest's large read without its bytes on the link.
//
// Every read a replicated guest makes is logged so that the standby holds
// what the guest saw (a kernel with floating-point atomics adds in another
// order on each node). Logged as the bytes read, an evaluation loop that
// reads its outputs back sends them over the link once more. Instead, a
// read of Log.ReadCheckMin bytes or more in a mode whose replies wait for the
// standby (commit, sync) is logged as a check (OpReadCheck): its range and
// the checksum of the bytes the guest got. The standby, having applied
// everything before it, compares its own bytes there; where they differ it
// sends MsgReadNeed naming the check's sequence, before any ack that
// covers it. The primary's reply to the read waits until the sync set
// applied the check (Log.WaitApplied), then logs the bytes as an ordinary
// read-back only if a standby asked (Log.TakeReadNeed) or none confirmed
// (the set shrank, a standby left): the guest is never told of bytes the
// standby could not reproduce after a failover. The price is latency, not
// bytes: the reply waits for the standby to apply up to the read (in
// commit mode it otherwise waits only until the standby holds it). A check
// is SessionScoped: a standby applying sessions side by side applies it
// in its session's lane, after that session's records before it, and the
// lane sends the need before it reports the check applied.

// DefaultReadCheckMin is the smallest read logged as a check unless told
// otherwise: a smaller one's bytes cost the link less than the wait for
// the standby's apply.
const DefaultReadCheckMin = 64 << 10

// SetReadCheckMin makes reads of n bytes or more go as checks (0: none,
// every read's bytes are logged).
func (l *Log) SetReadCheckMin(n int64) { l.checkMin.Store(n) }

// ReadCheckMin is the smallest read logged as a check (0: none is).
func (l *Log) ReadCheckMin() int64 { return l.checkMin.Load() }

// ReadCheck is an OpReadCheck body: the guest read N bytes at Addr (after
// the work of Stream) whose checksum (gpu.Checksum) is Sum.
type ReadCheck struct {
	Addr, Stream, N, Sum uint64
}

const readCheckSize = 32

// AppendReadCheck encodes c.
func AppendReadCheck(b []byte, c ReadCheck) []byte {
	for _, v := range [...]uint64{c.Addr, c.Stream, c.N, c.Sum} {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	return b
}

// DecodeReadCheck decodes an OpReadCheck body.
func DecodeReadCheck(b []byte) (ReadCheck, error) {
	if len(b) != readCheckSize {
		return ReadCheck{}, fmt.Errorf("read check of %d bytes, want %d", len(b), readCheckSize)
	}
	u := func(i int) uint64 { return binary.LittleEndian.Uint64(b[8*i:]) }
	return ReadCheck{Addr: u(0), Stream: u(1), N: u(2), Sum: u(3)}, nil
}

// maxReadNeeds bounds the needs kept for checks nobody takes (one that
// came after its reply stopped waiting, which logged the bytes anyway):
// past it the oldest is dropped (a reply waiting now is for a newer one).
const maxReadNeeds = 4096

// readNeeds are the checks a standby asked the bytes of, by sequence.
type readNeeds struct {
	mu  sync.Mutex
	seq map[uint64]bool
}

// NoteReadNeed records that a standby asked for the bytes of the check
// logged at seq (a Sender, on MsgReadNeed).
func (l *Log) NoteReadNeed(seq uint64) {
	n := &l.needs
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.seq == nil {
		n.seq = map[uint64]bool{}
	}
	if len(n.seq) >= maxReadNeeds {
		oldest := seq
		for s := range n.seq {
			oldest = min(oldest, s)
		}
		delete(n.seq, oldest)
	}
	n.seq[seq] = true
}

// TakeReadNeed reports whether a standby asked for the bytes of the check
// logged at seq, and forgets it.
func (l *Log) TakeReadNeed(seq uint64) bool {
	n := &l.needs
	n.mu.Lock()
	defer n.mu.Unlock()
	need := n.seq[seq]
	delete(n.seq, seq)
	return need
}
