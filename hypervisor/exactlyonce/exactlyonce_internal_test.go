package exactlyonce

import (
	"bytes"
	"testing"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// TestAppliedIDs: the window says which ids were applied, forgets the ids
// skipped over, and knows nothing of ids older than itself.
func TestAppliedIDs(t *testing.T) {
	var a appliedIDs
	for _, id := range []uint64{1, 2, 3, 5, 9} {
		a.mark(id, true)
	}
	for id, want := range map[uint64]bool{1: true, 2: true, 4: false, 5: true, 6: false, 8: false, 9: true, 10: false} {
		if applied, remembered := a.knows(id); applied != want || !remembered {
			t.Errorf("id %d: applied %v remembered %v, want %v", id, applied, remembered, want)
		}
	}
	// Wrapping around the window: an id skipped is not left marked by the
	// id a window earlier that shared its bit.
	a.mark(4+appliedWindow+1, true) // 5 .. 4+W skipped, 9's bit (9+W) among them
	if applied, _ := a.knows(9 + appliedWindow); applied {
		t.Error("a skipped id reads as applied through an older id's bit")
	}
	if _, remembered := a.knows(3); remembered {
		t.Error("an id older than the window is remembered")
	}
	a.mark(1<<40, true) // far ahead: the whole window is new
	if applied, _ := a.knows(1<<40 - 1); applied {
		t.Error("an id skipped by a jump reads as applied")
	}
	b, err := decodeAppliedIDs(a.append(nil))
	if err != nil || b != a {
		t.Fatalf("round trip: %v", err)
	}
	if _, err := decodeAppliedIDs(make([]byte, 9)); err == nil {
		t.Error("a 9-byte window decoded")
	}
}

// FuzzDecodeAppliedIDs: a snapshot's record of applied ids (a replicated
// OpSetNext body, network input on a standby) never panics the decoder,
// and an accepted one re-encodes to its input.
func FuzzDecodeAppliedIDs(f *testing.F) {
	var a appliedIDs
	a.mark(3, true)
	a.mark(7, true)
	f.Add(a.append(nil))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := decodeAppliedIDs(b)
		if err != nil || len(b) == 0 {
			return
		}
		if !bytes.Equal(got.append(nil), b) {
			t.Fatal("accepted window does not re-encode to its input")
		}
		for _, id := range []uint64{got.top, got.top - 1, 0} {
			got.knows(id)
		}
	})
}

// TestNoteFailed: a failed request is the table's last answered request
// but not an applied one; a resend of it gets its failure, its encoding
// round-trips, and a failure the log reports for an applied request is
// refused.
func TestNoteFailed(t *testing.T) {
	var tab Table
	tab.NoteApplied(1, 0)
	f := Failure{Op: abi.OpMemset, Status: abi.StatusOutOfRange, Message: "outside", Async: true, Stream: 3, Sum: 42, Summed: true}
	tab.NoteFailed(2, f)
	if tab.Last() != 2 {
		t.Fatalf("last %d, want 2", tab.Last())
	}
	if applied, _ := tab.applied.knows(2); applied {
		t.Fatal("a failed request reads as applied")
	}
	if err := tab.CheckFailed(1); err == nil {
		t.Fatal("a failure of an applied request was taken")
	}
	got, err := DecodeFailure(f.Append(nil))
	if err != nil || got != f {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	ids, fs := tab.Failures()
	if len(ids) != 1 || ids[0] != 2 || fs[0] != f {
		t.Fatalf("failures kept: %v %+v", ids, fs)
	}
}

// FuzzDecodeFailure: a logged request failure (network input on a
// standby) never panics the decoder, and an accepted one re-encodes to
// its input.
func FuzzDecodeFailure(f *testing.F) {
	f.Add(Failure{Op: abi.OpMemset, Status: abi.StatusOutOfRange, Message: "m", Async: true}.Append(nil))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := DecodeFailure(b)
		if err != nil {
			return
		}
		if !bytes.Equal(got.Append(nil), b) {
			t.Fatal("accepted failure does not re-encode to its input")
		}
	})
}

// TestResendsAnsweredAcrossTheWindow: a resend of any of the latest
// resultsKept requests is answered with its own result and a resend with
// other content is refused, after many more requests than either bound;
// an id older than the window gets no stale result.
func TestResendsAnsweredAcrossTheWindow(t *testing.T) {
	var tab Table
	payload := func(id uint64) []byte { return []byte{byte(id), byte(id >> 8), byte(id >> 16)} }
	const n = 3*sumsKept + 17
	for id := uint64(1); id <= n; id++ {
		if _, err, done := tab.Check(abi.OpAlloc, id, Sum(payload(id)), false); err != nil || done {
			t.Fatalf("request %d: %v done %v", id, err, done)
		}
		tab.NoteApplied(id, id*10)
	}
	for _, id := range []uint64{n, n - 1, n - resultsKept + 1} {
		reply, err, done := tab.Check(abi.OpAlloc, id, Sum(payload(id)), false)
		if err != nil || !done {
			t.Fatalf("resend of %d: %v done %v", id, err, done)
		}
		if got := reply.(*abi.AllocReply).Ptr; got != id*10 {
			t.Errorf("resend of %d answered %d, want %d", id, got, id*10)
		}
		if _, err, _ := tab.Check(abi.OpAlloc, id, Sum([]byte("other")), false); err == nil {
			t.Errorf("resend of %d with other content was not refused", id)
		}
	}
	if _, ok := tab.results.get(n - resultsKept); ok {
		t.Errorf("request %d, older than the %d kept, still has a result", n-resultsKept, resultsKept)
	}
}

// BenchmarkCheckApplied: what exactly-once costs a request that returns a
// result (Check, then NoteApplied), with the window full.
func BenchmarkCheckApplied(b *testing.B) {
	var tab Table
	payload := make([]byte, 64)
	for i := range b.N {
		id := uint64(i + 1)
		if _, err, _ := tab.Check(abi.OpAlloc, id, Sum(payload), false); err != nil {
			b.Fatal(err)
		}
		tab.NoteApplied(id, id)
	}
}
