package link

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

var testKey = []byte("0123456789abcdef0123456789abcdef")

// payloads are frames' payloads of mixed sizes (a record's encoding is
// opaque to the link): small ones sealed on the caller, large ones on
// workers, the largest in parts.
func payloads() [][]byte {
	var out [][]byte
	for i, size := range []int{10, 64 << 10, 3 << 20, 100, PartBytes - 48, SealApartFrom - 1, 2 << 20, 5, PartBytes - 48 + 1} {
		p := make([]byte, size)
		for j := range p {
			p[j] = byte(i*31 + j)
		}
		out = append(out, p)
	}
	return out
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

// TestOlderProtocolRefused: a peer that speaks the protocol before read
// checks (5: it would apply a check as an unknown record and never ask for
// the bytes) is refused at the handshake by either end, with an error
// that names both versions, before any key material is used.
func TestOlderProtocolRefused(t *testing.T) {
	old := append([]byte(helloMagic), 5, 0)
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
				_, err = ServerHandshake(a, testKey, 2*time.Second)
			} else {
				_, err = ClientHandshake(a, testKey, 2*time.Second)
			}
			if err == nil || !strings.Contains(err.Error(), "protocol 5, this side 6") {
				t.Fatalf("an old peer was not refused: %v", err)
			}
		})
	}
}

// FuzzLinkRead: an authenticated link fed arbitrary bytes returns frames or
// errors, never panics, and accepts nothing not MACed with its key.
func FuzzLinkRead(f *testing.F) {
	f.Add([]byte("VGRP\x01\x00\x00\x00\x04\x00\x00\x00abcdabcd"))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, _ := net.Pipe()
		defer a.Close()
		k := bytes.Repeat([]byte("k"), 32)
		l := NewConn(a, bufio.NewReader(bytes.NewReader(b)), k, k)
		for {
			if _, _, err := l.Read(); err != nil {
				return
			}
			// A frame was accepted: the fuzzer would have had to forge an
			// HMAC-SHA256 tag, so the MAC check must be broken.
			t.Fatal("link accepted a frame from unauthenticated input")
		}
	})
}

// writeSerial writes a record's frames as the wire format says, one after
// another on the caller: whole up to PartBytes, else its size and then
// its parts.
func writeSerial(l *Conn, enc []byte) {
	withTag := func(b []byte) []byte { return append(make([]byte, 0, len(b)+MacSize), b...) }
	if len(enc) <= PartBytes {
		l.Write(MsgRecord, withTag(enc))
		return
	}
	l.Write(MsgRecordBegin, withTag(binary.LittleEndian.AppendUint64(nil, uint64(len(enc)))))
	for off := 0; off < len(enc); off += PartBytes {
		l.Write(MsgRecordPart, withTag(enc[off:min(off+PartBytes, len(enc))]))
	}
}

// TestBulkStreamIsTheSerialStream: records sealed on several workers (in
// parts above PartBytes) go on the wire byte for byte as the same frames
// sealed one after another: same counters (nonces), same order; and the
// records themselves are left as they were.
func TestBulkStreamIsTheSerialStream(t *testing.T) {
	key := bytes.Repeat([]byte("k"), 32)
	var serial, parallel bytes.Buffer
	ls := NewConn(nil, nil, key, key)
	ls.w.Reset(&serial)
	lp := NewConn(nil, nil, key, key)
	lp.w.Reset(&parallel)
	bw := lp.Bulk()
	bw.frames = NewInOrder(4)
	given := 0
	var sent [][]byte
	for range 3 {
		for _, p := range payloads() {
			writeSerial(ls, p)
			sent = append(sent, p)
			if err := bw.Record(p, func() { given++ }); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := bw.Close(); err != nil {
		t.Fatal(err)
	}
	ls.Flush()
	lp.Flush()
	if given != len(sent) {
		t.Fatalf("%d records given back of %d", given, len(sent))
	}
	for i, p := range sent {
		if !bytes.Equal(p, payloads()[i%len(payloads())]) {
			t.Fatalf("sealing changed record %d", i)
		}
	}
	if !bytes.Equal(serial.Bytes(), parallel.Bytes()) {
		t.Fatalf("the parallel stream (%d bytes) differs from the serial one (%d bytes)", parallel.Len(), serial.Len())
	}
}
