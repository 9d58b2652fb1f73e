package replicate

import (
	"bytes"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vgpuha/vgpuha/replicate/link"
)

// TestDraftAppendsLikeAppend: a record whose body was filled in a draft is
// kept exactly as Append keeps the same record, in the draft's own buffer
// (no copy); a log that keeps nothing takes a draft too.
func TestDraftAppendsLikeAppend(t *testing.T) {
	l := NewLog(1 << 30)
	l.SetTerm(7)
	c := l.addCursor("standby")
	l.attach(c, true, 0, true)
	l.BeginSnapshot()
	d := l.NewDraft(100 << 10)
	copy(d.Body(), bytes.Repeat([]byte{5}, 100<<10))
	body := &d.Body()[0]
	l.AppendDraft(Record{Session: 3, ReqID: 9, Op: OpMMIO, Result: 4}, d)
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
	if &es[0].Body[0] != body {
		t.Fatal("the draft's body was copied")
	}
	if cap(es[0].enc)-len(es[0].enc) < link.MacSize {
		t.Fatal("no room for the link's tag")
	}

	idle := NewLog(1 << 30) // no standby: nothing kept
	d = idle.NewDraft(64 << 10)
	if seq := idle.AppendDraft(Record{Op: OpMMIO}, d); seq != 1 || idle.Last() != 1 {
		t.Fatalf("seq %d", seq)
	}
}

// TestDraftsInHostBuffers: with host buffers set, a large draft's buffer
// comes from their allocator and goes back to it for the next draft (never
// to the collector), up to the limit; a small draft, one beyond the limit
// and any after the allocator refused come from ordinary memory.
func TestDraftsInHostBuffers(t *testing.T) {
	const piece = 16<<20 - 4096
	l := NewLog(1 << 30)
	made := map[*byte]bool{}
	l.SetHostBuffers(func(n int) ([]byte, error) {
		b := make([]byte, n)
		made[&b[0]] = true
		return b, nil
	}, 40<<20)
	host := func(d *Draft) bool { return made[&d.enc[:1][0]] }

	a, b := l.NewDraft(piece), l.NewDraft(piece)
	if !host(a) || !host(b) || len(made) != 2 {
		t.Fatalf("two pieces: host buffers %v %v, %d made", host(a), host(b), len(made))
	}
	if c := l.NewDraft(piece); host(c) {
		t.Fatal("a third piece got a host buffer past the 40 MiB limit")
	}
	if small := l.NewDraft(64 << 10); host(small) {
		t.Fatal("a 64 KiB draft got a host buffer")
	}
	a.Discard()
	for range 3 { // back and forth: the same buffer each time
		d := l.NewDraft(piece)
		if !host(d) || len(made) != 2 {
			t.Fatalf("a piece after one was given back: host %v, %d made", host(d), len(made))
		}
		l.AppendDraft(Record{Session: 1, Op: 5}, d) // a log that keeps nothing gives it back at once
	}
	b.Discard()
	l2 := NewLog(1 << 30)
	l2.SetHostBuffers(func(n int) ([]byte, error) { return nil, bytes.ErrTooLarge }, 1<<30)
	if d := l2.NewDraft(piece); d.enc == nil || cap(d.enc) < piece {
		t.Fatal("a refused host buffer left the draft without memory")
	}
	if l2.pool.HostLimit() != 0 {
		t.Fatalf("after a refusal the pool still means to make %d bytes of host buffers", l2.pool.HostLimit())
	}
}
