package replicate

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
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

// pair returns two authenticated link ends over a real TCP connection.
func pair(t *testing.T, primaryKey, standbyKey []byte) (*link, *link, error, error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		l   *link
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			ch <- res{nil, err}
			return
		}
		l, err := serverHandshake(c, standbyKey, 2*time.Second)
		if err != nil {
			c.Close()
		}
		ch <- res{l, err}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	p, perr := clientHandshake(c, primaryKey, 2*time.Second)
	s := <-ch
	if s.l != nil {
		t.Cleanup(func() { s.l.c.Close() })
	}
	return p, s.l, perr, s.err
}

func TestHandshake(t *testing.T) {
	p, s, perr, serr := pair(t, testKey, testKey)
	if perr != nil || serr != nil {
		t.Fatalf("same key: %v / %v", perr, serr)
	}
	p.write(msgAck, []byte("hello"))
	p.flush()
	typ, payload, err := s.read()
	if err != nil || typ != msgAck || string(payload) != "hello" {
		t.Fatalf("read %d %q %v", typ, payload, err)
	}
	_, _, perr, serr = pair(t, []byte("another-key-entirely"), testKey)
	if !errors.Is(perr, ErrAuth) || !errors.Is(serr, ErrAuth) {
		t.Fatalf("different keys: primary %v, standby %v", perr, serr)
	}
}

// TestCorruptStream: a flipped bit anywhere in a frame, or a frame replayed
// from earlier in the stream, is refused.
func TestCorruptStream(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mangle func(frames [][]byte) []byte
	}{
		{"payload bit", func(f [][]byte) []byte { c := bytes.Clone(f[0]); c[frameHeader+2] ^= 1; return c }},
		{"tag bit, crc fixed", func(f [][]byte) []byte { c := bytes.Clone(f[0]); c[len(c)-1] ^= 1; return refreshCRC(c) }},
		{"type changed, crc fixed", func(f [][]byte) []byte { c := bytes.Clone(f[0]); c[4] ^= 3; return refreshCRC(c) }},
		{"replay", func(f [][]byte) []byte { return append(bytes.Clone(f[0]), f[0]...) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, s, perr, serr := pair(t, testKey, testKey)
			if perr != nil || serr != nil {
				t.Fatal(perr, serr)
			}
			// Capture the frame bytes the primary would send.
			var buf bytes.Buffer
			p.w.Reset(&buf)
			p.write(msgRecord, AppendRecord(nil, &Record{Seq: 1, Op: OpEpoch, Result: 1}))
			p.flush()
			frame := buf.Bytes()
			p.c.Write(tc.mangle([][]byte{frame}))
			var err error
			for i := 0; i < 2 && err == nil; i++ {
				_, _, err = s.read()
			}
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("mangled stream read as %v", err)
			}
		})
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

// refreshCRC recomputes a frame's CRC, as an attacker who edits a frame can:
// only the AEAD tag stands in the way.
func refreshCRC(f []byte) []byte {
	binary.LittleEndian.PutUint32(f[12:], frameCRC(f, f[frameHeader:]))
	return f
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

// TestUDPHeartbeats: authentic heartbeats are heard; forged ones (wrong key)
// and replays are not.
func TestUDPHeartbeats(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := pc.LocalAddr().String()
	pc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	heard := make(chan uint64, 100)
	go ListenUDPHeartbeats(ctx, addr, testKey, func(primary, term uint64) {
		if primary != 7 {
			t.Errorf("heartbeat from primary %d, want 7", primary)
		}
		heard <- term
	}, nil)
	time.Sleep(50 * time.Millisecond)
	go SendUDPHeartbeats(ctx, addr, []byte("wrong key, wrong key, wrong key!"), 7, func() uint64 { return 9 }, 5*time.Millisecond, nil)
	select {
	case term := <-heard:
		t.Fatalf("heard a forged heartbeat (term %d)", term)
	case <-time.After(100 * time.Millisecond):
	}
	go SendUDPHeartbeats(ctx, addr, testKey, 7, func() uint64 { return 4 }, 5*time.Millisecond, nil)
	select {
	case term := <-heard:
		if term != 4 {
			t.Fatalf("term %d", term)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("authentic heartbeats not heard")
	}
	// A replayed datagram is ignored.
	b := append([]byte(udpMagic), make([]byte, 8)...)
	b = binary.LittleEndian.AppendUint64(b, 7)
	b = binary.LittleEndian.AppendUint64(b, 1)
	b = binary.LittleEndian.AppendUint64(b, 5)
	b = append(b, heartbeatTag(testKey, b)...)
	c, _ := net.Dial("udp", addr)
	defer c.Close()
	c.Write(b)
	c.Write(b)
	got := 0
	timeout := time.After(200 * time.Millisecond)
	for done := false; !done; {
		select {
		case term := <-heard:
			if term == 5 {
				got++
			}
		case <-timeout:
			done = true
		}
	}
	if got != 1 {
		t.Fatalf("one datagram sent twice was heard %d times", got)
	}
}

// TestOlderProtocolRefused: a peer that speaks the protocol before the
// primary's identity (4) is refused at the handshake by either end, with
// an error that names both versions, before any key material is used.
func TestOlderProtocolRefused(t *testing.T) {
	old := append([]byte(helloMagic), 4, 0)
	old = append(old, make([]byte, nonceSize)...)
	for _, side := range []string{"standby", "primary"} {
		t.Run("by the "+side, func(t *testing.T) {
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			go io.Copy(io.Discard, b) // the old peer reads what comes
			go b.Write(old)           // and says hello
			var err error
			if side == "standby" {
				_, err = serverHandshake(a, testKey, 2*time.Second)
			} else {
				_, err = clientHandshake(a, testKey, 2*time.Second)
			}
			if err == nil || !strings.Contains(err.Error(), "protocol 4, this side 5") {
				t.Fatalf("an old peer was not refused: %v", err)
			}
		})
	}
}
