package replicate

import (
	"testing"
	"time"
)

// TestSessionShare: a session past its share of bytes the standby has not
// received waits for its own backlog to be received, while another
// session's records go in at once; a record larger than the share goes in
// alone; without a share (or a standby in the sync set) nobody waits.
func TestSessionShare(t *testing.T) {
	l, cs := syncedPeers(t, 1<<30, 1, 1)
	l.SetSessionShare(64 << 10)
	appendOf := func(session uint64, size int) func() bool {
		return func() bool { l.Append(Record{Session: session, Op: OpMMIO, Body: make([]byte, size)}); return true }
	}
	if _, timedOut := returnsWithin(appendOf(1, 200<<10), time.Second); timedOut {
		t.Fatal("a record larger than the share, with nothing in flight, waited")
	}
	waited := make(chan bool, 1)
	go func() { _, timedOut := returnsWithin(appendOf(1, 1<<10), 100*time.Millisecond); waited <- timedOut }()
	if _, timedOut := returnsWithin(appendOf(2, 32<<10), time.Second); timedOut {
		t.Fatal("another session waited for the busy one's backlog")
	}
	if !<-waited {
		t.Fatal("a session past its share did not wait for its backlog")
	}
	l.ack(cs[0], 2, 0) // received the busy session's record and the other's: room again
	waitLast(t, l, 3)
	l.SetSessionShare(0)
	for range 4 {
		if _, timedOut := returnsWithin(appendOf(1, 200<<10), time.Second); timedOut {
			t.Fatal("a session waited with no share set")
		}
	}
	if got := l.Piece(); got != 0 {
		t.Fatalf("piece %d without a share, want 0 (no bound)", got)
	}
	l.SetSessionShare(1 << 20)
	if got := l.Piece(); got != 256<<10 {
		t.Fatalf("piece %d with a 1 MiB share, want 256 KiB", got)
	}
	l.attach(cs[0], false, 0, false)
	if got := l.Piece(); got != 0 {
		t.Fatalf("piece %d with no standby in the sync set, want 0 (no bound)", got)
	}
}
