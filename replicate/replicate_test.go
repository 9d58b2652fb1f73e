package replicate

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

var testKey = []byte("0123456789abcdef0123456789abcdef")

func TestRecordRoundTrip(t *testing.T) {
	r := Record{Seq: 9, Term: 2, Session: 3, ReqID: 4, Op: OpSessionOpen, Flags: FlagPlaced, Result: 0x7e00, Body: []byte("guest")}
	got, err := DecodeRecord(AppendRecord(nil, &r))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(r, got, cmp.AllowUnexported(Record{})); diff != "" {
		t.Fatal(diff)
	}
	b := AppendRecord(nil, &r)
	for name, bad := range map[string][]byte{
		"short":      b[:10],
		"long":       append(b, 0),
		"bad kind":   func() []byte { c := bytes.Clone(b); c[40], c[41] = 0xff, 0x0f; return c }(),
		"bad flags":  func() []byte { c := bytes.Clone(b); c[43] = 0x80; return c }(),
		"body short": b[:len(b)-1],
	} {
		if _, err := DecodeRecord(bad); !errors.Is(err, ErrBadRecord) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestLogBackpressureAndAcks(t *testing.T) {
	l := NewLog(100)
	c := l.addCursor("standby")
	l.attach(c, true, 0, true)
	l.BeginSnapshot() // an empty primary's snapshot
	l.snapshotSent(c)
	l.ack(c, 0, 0) // the standby applied it: protected
	done := make(chan uint64)
	go func() {
		for i := 0; i < 5; i++ {
			l.Append(Record{Op: OpEpoch, Body: make([]byte, 40)})
		}
		done <- l.Last()
	}()
	select {
	case <-done:
		t.Fatal("five 88-byte records appended past a 100-byte bound with no acks")
	case <-time.After(100 * time.Millisecond):
	}
	l.ack(c, l.Last(), l.Last())
	for l.Last() < 5 {
		l.ack(c, l.Last(), l.Last())
		time.Sleep(time.Millisecond)
	}
	<-done
	l.ack(c, l.Last(), l.Last())
	if !l.WaitApplied(l.Last()) {
		t.Fatal("everything acked but WaitApplied says no")
	}
	l.attach(c, false, 0, false)
	if l.WaitApplied(l.Last() + 100) {
		t.Fatal("WaitApplied claims a future record applied")
	}
}

// TestReceivedIsNotApplied: the commit rule waits for what the standby
// holds, sync for what it applied, and the log keeps what is not applied.
func TestReceivedIsNotApplied(t *testing.T) {
	l := NewLog(1 << 20)
	c := l.addCursor("standby")
	l.attach(c, true, 0, true)
	l.BeginSnapshot()
	l.snapshotSent(c)
	l.ack(c, 0, 0)
	for i := 0; i < 3; i++ {
		l.Append(Record{Op: OpEpoch, Body: make([]byte, 40)})
	}
	l.ack(c, 3, 1) // all three held, one applied
	if !l.WaitReceived(3) {
		t.Fatal("WaitReceived(3) with 3 held: false")
	}
	applied := make(chan bool, 1)
	go func() { applied <- l.WaitApplied(3) }()
	select {
	case <-applied:
		t.Fatal("WaitApplied(3) returned with only 1 applied")
	case <-time.After(50 * time.Millisecond):
	}
	if st := l.Status(); st.Applied != 1 || st.LagOps != 2 || st.LagBytes == 0 {
		t.Fatalf("the log must keep what is held but not applied: %+v", st)
	}
	l.ack(c, 3, 3)
	if !<-applied {
		t.Fatal("WaitApplied(3) false once 3 applied")
	}
}

func TestMetricsLint(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg, "127.0.0.1:1", func() SenderStatus { return SenderStatus{} })
	if _, err := NewMetrics(reg, "127.0.0.1:2", func() SenderStatus { return SenderStatus{} }); err != nil {
		t.Fatalf("a second standby's metrics: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	m.sentBytes.Add(1)
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("metric %s: %s", p.Metric, p.Text)
	}
}
