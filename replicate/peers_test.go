package replicate

import (
	"testing"
	"time"
)

// syncedPeers returns a log with n standbys, each resynced from an empty
// snapshot and caught up, and k set.
func syncedPeers(t *testing.T, maxBytes int64, n, k int) (*Log, []*cursor) {
	t.Helper()
	l := NewLog(maxBytes)
	l.SetMinInSync(k)
	cs := make([]*cursor, n)
	for i := range cs {
		cs[i] = l.addCursor(string(rune('a' + i)))
		l.attach(cs[i], true, 0, true)
	}
	l.BeginSnapshot()
	for _, c := range cs {
		l.snapshotSent(c)
		l.ack(c, 0, 0)
	}
	if st := l.Status(); st.InSyncCount != min(n, k) {
		t.Fatalf("%d standbys in sync after their resync, want %d: %+v", st.InSyncCount, min(n, k), st)
	}
	return l, cs
}

// returnsWithin runs f and reports its result, or false with timedOut
// when it did not return within d.
func returnsWithin(f func() bool, d time.Duration) (ok, timedOut bool) {
	done := make(chan bool, 1)
	go func() { done <- f() }()
	select {
	case ok := <-done:
		return ok, false
	case <-time.After(d):
		return false, true
	}
}

// TestCommitWaitsForEveryStandbyOfTheSyncSet: with k = 2 a reply waits
// until both standbys hold it; one is not enough.
func TestCommitWaitsForEveryStandbyOfTheSyncSet(t *testing.T) {
	l, cs := syncedPeers(t, 1<<20, 2, 2)
	seq := l.Append(Record{Op: OpEpoch})
	held := make(chan bool, 1)
	go func() { held <- l.WaitReceived(seq) }()
	l.ack(cs[0], seq, 0)
	select {
	case <-held:
		t.Fatal("the reply was let out when one of two standbys held it (k = 2)")
	case <-time.After(100 * time.Millisecond):
	}
	l.ack(cs[1], seq, 0)
	if !<-held {
		t.Fatal("both standbys hold the record, WaitReceived says no")
	}
	if st := l.Status(); st.LagOps != 1 || st.LagBytes == 0 {
		t.Fatalf("the record is applied by neither, yet the log let it go: %+v", st)
	}
	l.ack(cs[0], seq, seq)
	if st := l.Status(); st.LagBytes == 0 {
		t.Fatalf("one standby applied the record, the other did not: the log must keep it: %+v", st)
	}
	l.ack(cs[1], seq, seq)
	if st := l.Status(); st.LagBytes != 0 || st.LagOps != 0 {
		t.Fatalf("both applied, the log still holds it: %+v", st)
	}
}

// TestSyncSetIsTheFirstKCaughtUp: with k = 1 and two caught-up
// standbys, replies wait for the first only; when it goes, the second
// takes its place.
func TestSyncSetIsTheFirstKCaughtUp(t *testing.T) {
	l, cs := syncedPeers(t, 1<<20, 2, 1)
	seq := l.Append(Record{Op: OpEpoch})
	l.ack(cs[0], seq, seq)
	if ok, timedOut := returnsWithin(func() bool { return l.WaitReceived(seq) }, time.Second); !ok || timedOut {
		t.Fatalf("k = 1: the first standby holds the record, WaitReceived %v (timed out %v)", ok, timedOut)
	}
	l.attach(cs[0], false, 0, false)
	seq = l.Append(Record{Op: OpEpoch})
	if _, timedOut := returnsWithin(func() bool { return l.WaitReceived(seq) }, 100*time.Millisecond); !timedOut {
		t.Fatal("the first standby left: the second must be waited for")
	}
	l.ack(cs[1], seq, seq)
	if ok, _ := returnsWithin(func() bool { return l.WaitReceived(seq) }, time.Second); !ok {
		t.Fatal("the second standby holds the record, WaitReceived says no")
	}
	if st := l.peerStatus(cs[1]); !st.InSync {
		t.Fatalf("the second standby did not join the sync set: %+v", st)
	}
}

// TestSurplusStandbyDroppedNotWaitedFor: a standby outside a full sync set
// that falls behind past the bound is dropped (it resyncs); guests never
// wait for it.
func TestSurplusStandbyDroppedNotWaitedFor(t *testing.T) {
	l, cs := syncedPeers(t, 1000, 2, 1)
	go func() { // the first standby keeps up
		for !l.Closed() {
			last := l.Last()
			l.ack(cs[0], last, last)
			time.Sleep(time.Millisecond)
		}
	}()
	defer l.Close()
	if !appendsWithin(l, 20, 452, 5*time.Second) {
		t.Fatal("guests waited for a standby outside the sync set")
	}
	if st := l.peerStatus(cs[1]); st.LagBytes != 0 || l.next(cs[1], 0, nil, 1<<20) != nil {
		t.Fatalf("the lagging standby was not dropped: %+v", st)
	}
}

// TestDepartureHeldUntilRecorded: under a coordinator a standby that left
// the sync set may still be recorded in sync: replies wait until Confirm
// says the record no longer names it, then go on with the rest of the set.
func TestDepartureHeldUntilRecorded(t *testing.T) {
	l, cs := syncedPeers(t, 1<<20, 2, 2)
	l.RecordDepartures()
	seq := l.Append(Record{Op: OpEpoch})
	l.ack(cs[0], seq, seq)
	l.attach(cs[1], false, 0, false) // lost
	if ok, timedOut := returnsWithin(func() bool { return l.WaitReceived(seq) }, time.Second); ok || timedOut {
		t.Fatalf("a standby left the set, not yet off the record: WaitReceived %v, timed out %v; want false at once", ok, timedOut)
	}
	if got := l.Unconfirmed(); len(got) != 1 || got[0] != "b" {
		t.Fatalf("unconfirmed %v, want [b]", got)
	}
	l.Confirm([]string{"a", "b"}) // the record still names it
	if ok, _ := returnsWithin(func() bool { return l.WaitReceived(seq) }, time.Second); ok {
		t.Fatal("the record still names the lost standby, yet the reply went out")
	}
	l.Confirm([]string{"a"})
	if ok, _ := returnsWithin(func() bool { return l.WaitReceived(seq) }, time.Second); !ok {
		t.Fatal("the record names only the remaining standby, which holds the record: WaitReceived says no")
	}
}

// TestInSyncOnlyOnceItHoldsWhatWentOut: a standby that joins the sync set
// is in sync (a coordinator may record it, it may campaign) only once it
// holds everything the log held when it joined: replies let out before
// it joined did not wait for it.
func TestInSyncOnlyOnceItHoldsWhatWentOut(t *testing.T) {
	l := NewLog(1 << 20)
	c := l.addCursor("a")
	l.attach(c, true, 0, true)
	at := l.BeginSnapshot()
	l.snapshotSent(c)
	for range 3 {
		l.Append(Record{Op: OpEpoch}) // unprotected: replies go out
	}
	l.ack(c, at, at) // applied the snapshot; lags by 3 small records: protects
	if st := l.peerStatus(c); !st.Protected || st.InSync {
		t.Fatalf("caught up but lacking 3 records let out: want protected, not in sync: %+v", st)
	}
	l.ack(c, at+3, at)
	if st := l.peerStatus(c); !st.InSync {
		t.Fatalf("holds everything: want in sync: %+v", st)
	}
}
