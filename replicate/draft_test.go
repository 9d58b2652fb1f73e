package replicate

import (
	"bytes"
	"testing"

	"github.com/google/go-cmp/cmp"
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
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatal(diff)
	}
	if diff := cmp.Diff(want, es[0].Record); diff != "" {
		t.Fatal(diff)
	}
	if &es[0].Body[0] != body {
		t.Fatal("the draft's body was copied")
	}
	if cap(es[0].enc)-len(es[0].enc) < macSize {
		t.Fatal("no room for the link's tag")
	}

	idle := NewLog(1 << 30) // no standby: nothing kept
	d = idle.NewDraft(64 << 10)
	if seq := idle.AppendDraft(Record{Op: OpMMIO}, d); seq != 1 || idle.Last() != 1 {
		t.Fatalf("seq %d", seq)
	}
}
