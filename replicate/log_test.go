package replicate

import (
	"bytes"
	"fmt"
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vgpuha/vgpuha/replicate/internal/bufpool"
	"github.com/vgpuha/vgpuha/replicate/link"
)

// TestLogEntriesEncodedOnce: the log keeps each record encoded, stamped
// with its sequence and term, and the body is the log's own copy.
func TestLogEntriesEncodedOnce(t *testing.T) {
	l := NewLog(1 << 30)
	c := l.addCursor("standby")
	l.SetTerm(7)
	l.attach(c, true, 0, true)
	l.BeginSnapshot()
	body := bytes.Repeat([]byte{5}, 100<<10)
	l.Append(Record{Session: 3, ReqID: 9, Op: OpMMIO, Result: 4, Body: body})
	body[0] = 6 // the guest's buffer is reused: the log must not see it
	es := l.next(c, 0, nil, 1<<30)
	if len(es) != 1 {
		t.Fatalf("%d entries", len(es))
	}
	got, err := DecodeRecord(es[0].enc)
	if err != nil {
		t.Fatal(err)
	}
	want := Record{Seq: 1, Term: 7, Session: 3, ReqID: 9, Op: OpMMIO, Result: 4, Body: bytes.Repeat([]byte{5}, 100<<10)}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(Record{})); diff != "" {
		t.Fatal(diff)
	}
	if diff := cmp.Diff(want, es[0].Record, cmp.AllowUnexported(Record{})); diff != "" {
		t.Fatal(diff)
	}
	if cap(es[0].enc)-len(es[0].enc) < link.MacSize {
		t.Fatalf("no room for the link's tag: len %d cap %d", len(es[0].enc), cap(es[0].enc))
	}
}

// TestLogReusesOnlySentBuffers: a record's buffer is reused once the
// standby applied it and the sender is done with it, never before (an ack
// that runs ahead of the sender must not hand a buffer being sealed to
// the next Append).
func TestLogReusesOnlySentBuffers(t *testing.T) {
	l := NewLog(1 << 30)
	l.pool.Ahead = 0 // no buffers made ahead: a released one is the only one free
	c := l.addCursor("standby")
	l.attach(c, true, 0, true)
	l.BeginSnapshot()
	l.snapshotSent(c)
	big := make([]byte, 1<<20)
	l.Append(Record{Op: OpMMIO, Body: big})
	first := &l.next(c, 0, nil, 1<<30)[0].enc[0]
	l.ack(c, 1, 1) // applied, but the sender has not said it is done
	l.Append(Record{Op: OpMMIO, Body: big})
	if &l.next(c, 1, nil, 1<<30)[0].enc[0] == first {
		t.Fatal("a buffer the sender may still be sealing was reused")
	}
	l.sentThrough(c, 2)
	second := &l.next(c, 1, nil, 1<<30)[0].enc[0]
	l.ack(c, 2, 2)
	l.Append(Record{Op: OpMMIO, Body: big})
	if &l.next(c, 2, nil, 1<<30)[0].enc[0] != second {
		t.Fatal("an applied, sent record's buffer was not reused")
	}
}

// BenchmarkGrowingLogCopy: what a guest's goroutine pays to copy a 256 KiB
// request into the log while the log only grows (a standby joining):
// fresh buffers (ahead 0) against buffers a refill made ahead.
func BenchmarkGrowingLogCopy(b *testing.B) {
	const size = 256 << 10
	src := make([]byte, size)
	for _, ahead := range []int{0, poolAhead} {
		b.Run(fmt.Sprintf("ahead=%dMiB", ahead>>20), func(b *testing.B) {
			p := bufpool.Pool{Max: poolMaxIdle, Ahead: ahead}
			var kept [][]byte // retained, as the log retains them
			b.SetBytes(size)
			for range b.N {
				buf := p.Get(size)
				kept = append(kept, append(buf, src...))
				if len(kept) == 4096 { // 1 GiB: let it go, from fresh memory again
					b.StopTimer()
					kept = nil
					runtime.GC()
					debug.FreeOSMemory()
					b.StartTimer()
				}
			}
		})
	}
}

// TestLogNextBatches: the sender takes a backlog in pieces of at most
// maxBytes, at least one record each.
func TestLogNextBatches(t *testing.T) {
	l := NewLog(1 << 30)
	c := l.addCursor("standby")
	l.attach(c, true, 0, true)
	l.BeginSnapshot()
	for range 3 {
		l.Append(Record{Op: OpMMIO, Body: make([]byte, 100<<10)})
	}
	for _, tc := range []struct{ max, want int }{{1, 1}, {250 << 10, 2}, {1 << 30, 3}} {
		if got := len(l.next(c, 0, nil, tc.max)); got != tc.want {
			t.Errorf("next with %d bytes: %d records, want %d", tc.max, got, tc.want)
		}
	}
	if got := l.next(c, 1, nil, 1); len(got) != 1 || got[0].Seq != 2 {
		t.Errorf("next after 1: %+v", got)
	}
}

// appendsWithin reports whether n appends of size bytes finish within d.
func appendsWithin(l *Log, n, size int, d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		for range n {
			l.Append(Record{Op: OpMMIO, Body: make([]byte, size)})
		}
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// TestCatchUpBoundStartsOnceSnapshotApplied: guests are not held up while
// the standby still applies the snapshot it read ahead (measured: both
// guests of bench resync stopped 1.6 s, the time the standby took to
// apply its last 256 MiB); once it applied it, the log may not grow past
// what it held, and each ack lets guests add half of what it drained.
func TestCatchUpBoundStartsOnceSnapshotApplied(t *testing.T) {
	l := NewLog(1000)
	c := l.addCursor("standby")
	l.attach(c, true, 0, true)
	at := l.BeginSnapshot()
	for range 5 {
		l.Append(Record{Op: OpMMIO, Body: make([]byte, 452)}) // 500 bytes each, kept
	}
	l.snapshotSent(c)
	if !appendsWithin(l, 5, 452, time.Second) {
		t.Fatal("guests blocked while the standby had not applied the snapshot")
	}
	l.ack(c, at, at) // the snapshot is applied: 5000 bytes held
	if appendsWithin(l, 2, 452, 100*time.Millisecond) {
		t.Fatal("the log grew past what it held when the catch-up began")
	}
	// One append is blocked (and one more waits to start). The standby
	// applies 4 records (2000 bytes): guests get 1000.
	l.ack(c, at+4, at+4)
	waitLast(t, l, at+12)
	if got := l.Status().LagBytes; got != 4000 {
		t.Fatalf("after draining 2000 bytes the log holds %d, want 4000 (half of the drain let in)", got)
	}
	l.Close()
}

// TestStreamingSnapshotEarnsTheBudget: while a snapshot streams, guests
// may fill half the resync budget at once, and the other half as the
// snapshot's bytes go out; nothing is dropped and the resync goes on.
func TestStreamingSnapshotEarnsTheBudget(t *testing.T) {
	l := NewLog(1000)
	l.SetResyncBudget(4000)
	l.SetResyncStall(time.Hour) // waits for the stream, not for the stall
	c := l.addCursor("standby")
	l.attach(c, true, 0, true)
	l.BeginSnapshot()
	l.streamed(c, 0, 100)
	if !appendsWithin(l, 4, 452, time.Second) { // 500 bytes each: half the budget
		t.Fatal("guests blocked within half the budget")
	}
	if appendsWithin(l, 2, 452, 100*time.Millisecond) {
		t.Fatal("the log grew past half the budget before the snapshot streamed")
	}
	l.streamed(c, 50, 100) // half sent: 3000 bytes allowed, the blocked append and one more
	waitLast(t, l, 6)
	if got := l.Status().LagBytes; got != 3000 {
		t.Fatalf("half the snapshot sent: the log holds %d bytes, want 3000", got)
	}
	l.snapshotSent(c) // all of the budget
	if !appendsWithin(l, 2, 452, time.Second) {
		t.Fatal("guests blocked within the budget once the snapshot was sent")
	}
	if l.resyncOverBudget(c) {
		t.Fatal("the log dropped what the resync needs")
	}
	l.Close()
}

// TestResyncStallBoundsAWrite: a write that the snapshot stream has not
// yet earned room for waits at most the resync stall, then goes in, while
// the stream does not move at all; at the whole budget writes wait for the
// stream, and nothing the resync needs is dropped.
func TestResyncStallBoundsAWrite(t *testing.T) {
	l := NewLog(1000)
	l.SetResyncBudget(4000)
	l.SetResyncStall(20 * time.Millisecond)
	c := l.addCursor("standby")
	l.attach(c, true, 0, true)
	l.BeginSnapshot()
	l.streamed(c, 0, 100)
	if !appendsWithin(l, 4, 452, time.Second) { // half the budget: no wait
		t.Fatal("guests blocked within half the budget")
	}
	start := time.Now()
	if !appendsWithin(l, 4, 452, 5*time.Second) { // the other half, unearned
		t.Fatal("writes past the stream's allowance waited for the stream, not the stall")
	}
	if waited := time.Since(start); waited < 4*20*time.Millisecond {
		t.Fatalf("4 unearned writes went in after %v, want each to wait the 20ms stall", waited)
	}
	if got := l.Status().LagBytes; got != 4000 {
		t.Fatalf("the log holds %d bytes, want the whole budget (4000)", got)
	}
	if appendsWithin(l, 1, 452, 100*time.Millisecond) {
		t.Fatal("the log grew past its resync budget")
	}
	if l.resyncOverBudget(c) {
		t.Fatal("the log dropped what the resync needs")
	}
	l.snapshotSent(c)
	l.ack(c, 8, 8) // the standby applied everything: the blocked write goes in
	waitLast(t, l, 9)
	if l.Last() != 9 {
		t.Fatal("the write blocked at the budget never went in")
	}
	l.Close()
}

// TestAutomaticResyncBudget: by default the budget grows to a quarter of
// each snapshot (never below the default); a budget set by the operator
// stays as set.
func TestAutomaticResyncBudget(t *testing.T) {
	l := NewLog(1000)
	defer l.Close()
	c := l.addCursor("standby")
	l.attach(c, true, 0, true)
	l.BeginSnapshot()
	budget := func() int64 { l.mu.Lock(); defer l.mu.Unlock(); return l.resyncBudget }
	l.streamed(c, 0, 1<<30)
	if got := budget(); got != DefaultResyncBudget {
		t.Fatalf("a 1 GiB snapshot: budget %d, want the default %d", got, DefaultResyncBudget)
	}
	l.streamed(c, 0, 16<<30)
	if got := budget(); got != 4<<30 {
		t.Fatalf("a 16 GiB snapshot: budget %d, want 4 GiB", got)
	}
	l.SetResyncBudget(2 << 30)
	l.streamed(c, 0, 64<<30)
	if got := budget(); got != 2<<30 {
		t.Fatalf("a budget set to 2 GiB became %d", got)
	}
	l.SetResyncBudget(0)
	l.streamed(c, 0, 64<<30)
	if got := budget(); got != 16<<30 {
		t.Fatalf("automatic again, a 64 GiB snapshot: budget %d, want 16 GiB", got)
	}
}

// TestGuestShareBoundsWritesWhileAStandbyJoins: with a guest share f,
// guests write resyncBurst at once (at most half the budget), then earn
// f/(1-f) of each snapshot byte sent; while the standby catches up they
// may add f of what it drains.
func TestGuestShareBoundsWritesWhileAStandbyJoins(t *testing.T) {
	l := NewLog(1000)
	l.SetResyncBudget(8000)
	l.SetResyncStall(time.Hour) // waits for the stream, not for the stall
	l.SetResyncGuestShare(0.2)  // a quarter of each byte sent
	c := l.addCursor("standby")
	l.attach(c, true, 0, true)
	at := l.BeginSnapshot()
	l.streamed(c, 0, 1<<20)
	if !appendsWithin(l, 8, 452, time.Second) { // 500 bytes each: the burst, half the budget
		t.Fatal("guests blocked within the burst")
	}
	if appendsWithin(l, 2, 452, 100*time.Millisecond) {
		t.Fatal("the log grew past the burst before the snapshot streamed")
	}
	l.streamed(c, 4000, 1<<20) // 4000 bytes sent earn 1000: the blocked append and one more
	waitLast(t, l, at+10)
	if got := l.Status().LagBytes; got != 5000 {
		t.Fatalf("4000 snapshot bytes sent: the log holds %d bytes, want 5000", got)
	}
	l.snapshotSent(c) // the whole budget
	if !appendsWithin(l, 1, 452, time.Second) {
		t.Fatal("guests blocked within the budget once the snapshot was sent")
	}
	waitLast(t, l, at+11)
	l.ack(c, at, at) // the snapshot is applied: 5500 bytes held, the catch-up bound
	if appendsWithin(l, 2, 452, 100*time.Millisecond) {
		t.Fatal("the log grew past what it held when the catch-up began")
	}
	appendsWithin(l, 2, 452, 10*time.Millisecond) // three writes wait now
	// The standby applies 5 records (2500 bytes): the bound falls by four
	// fifths of that to 3500, and a write goes in while the log holds no
	// more than the bound: one (with half of each drain, two: 4500).
	l.ack(c, at+5, at+5)
	waitLast(t, l, at+13)
	time.Sleep(50 * time.Millisecond)
	if got := l.Status().LagBytes; got != 4000 {
		t.Fatalf("after draining 2500 bytes the log holds %d, want 4000 (a fifth of the drain let in)", got)
	}
	l.Close()
}

// waitLast waits until the log's last sequence reaches seq.
func waitLast(t *testing.T, l *Log, seq uint64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for l.Last() < seq && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if l.Last() < seq {
		t.Fatalf("the log reached %d, want %d", l.Last(), seq)
	}
}
