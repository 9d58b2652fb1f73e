package replicate

import (
	"bytes"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestLogEntriesEncodedOnce: the log keeps each record encoded, stamped
// with its sequence and term, and the body is the log's own copy.
func TestLogEntriesEncodedOnce(t *testing.T) {
	l := NewLog(1 << 30)
	l.SetTerm(7)
	l.attach(true, 0, true)
	l.BeginSnapshot()
	body := bytes.Repeat([]byte{5}, 100<<10)
	l.Append(Record{Session: 3, ReqID: 9, Op: OpMMIO, Result: 4, Body: body})
	body[0] = 6 // the guest's buffer is reused: the log must not see it
	es := l.next(0, nil)
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
	if cap(es[0].enc)-len(es[0].enc) < macSize {
		t.Fatalf("no room for the link's tag: len %d cap %d", len(es[0].enc), cap(es[0].enc))
	}
}

// TestLogReusesOnlySentBuffers: a record's buffer is reused once the
// standby applied it and the sender is done with it, never before (an ack
// that runs ahead of the sender must not hand a buffer being sealed to
// the next Append).
func TestLogReusesOnlySentBuffers(t *testing.T) {
	l := NewLog(1 << 30)
	l.attach(true, 0, true)
	l.BeginSnapshot()
	l.snapshotSent()
	big := make([]byte, 1<<20)
	l.Append(Record{Op: OpMMIO, Body: big})
	first := &l.next(0, nil)[0].enc[0]
	l.ack(1, 1) // applied, but the sender has not said it is done
	l.Append(Record{Op: OpMMIO, Body: big})
	if &l.next(1, nil)[0].enc[0] == first {
		t.Fatal("a buffer the sender may still be sealing was reused")
	}
	l.sentThrough(2)
	second := &l.next(1, nil)[0].enc[0]
	l.ack(2, 2)
	l.Append(Record{Op: OpMMIO, Body: big})
	if &l.next(2, nil)[0].enc[0] != second {
		t.Fatal("an applied, sent record's buffer was not reused")
	}
}

func TestBufPool(t *testing.T) {
	p := bufPool{max: 3 << 20}
	a := p.get(1 << 20)
	if cap(a) < 1<<20 || len(a) != 0 {
		t.Fatalf("len %d cap %d", len(a), cap(a))
	}
	p.put(a)
	if b := p.get(100 << 10); cap(b) == cap(a) {
		t.Fatal("a 1 MiB buffer handed out for 100 KiB")
	}
	if b := p.get(1<<20 - 10); &b[:1][0] != &a[:1][0] {
		t.Fatal("a fitting free buffer was not reused")
	}
	for range 4 {
		p.put(make([]byte, 0, 1<<20))
	}
	if p.idle > p.max {
		t.Fatalf("%d idle bytes kept, bound %d", p.idle, p.max)
	}
}
