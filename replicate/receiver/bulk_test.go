package receiver

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"io"
	"log/slog"
	"net"
	"slices"
	"testing"

	"github.com/vgpuha/vgpuha/replicate"
	"github.com/vgpuha/vgpuha/replicate/link"
	"github.com/vgpuha/vgpuha/replicate/link/linktest"
)

// bulkPayloads are record encodings of mixed sizes: small ones sealed on
// the caller, large ones on workers, the largest in parts.
func bulkPayloads() [][]byte {
	var out [][]byte
	for i, size := range []int{10, lendAbove, 3 << 20, 100, link.PartBytes - recordHeader, link.SealApartFrom - 1, 2 << 20, 5, link.PartBytes - recordHeader + 1} {
		body := make([]byte, size)
		fillPattern(body, i)
		out = append(out, replicate.AppendRecord(nil, &replicate.Record{Op: replicate.OpMMIO, Flags: replicate.FlagPlaced, Result: uint64(i), Body: body}))
	}
	return out
}

// writeSerial writes a record's frames as the wire format says, one after
// another on the caller: whole up to partBytes, else its size and then
// its parts.
func writeSerial(l *link.Conn, enc []byte) {
	withTag := func(b []byte) []byte { return append(make([]byte, 0, len(b)+link.MacSize), b...) }
	if len(enc) <= link.PartBytes {
		l.Write(link.MsgRecord, withTag(enc))
		return
	}
	l.Write(link.MsgRecordBegin, withTag(binary.LittleEndian.AppendUint64(nil, uint64(len(enc)))))
	for off := 0; off < len(enc); off += link.PartBytes {
		l.Write(link.MsgRecordPart, withTag(enc[off:min(off+link.PartBytes, len(enc))]))
	}
}

// TestResyncOverParallelLinkArrivesInOrder: a real sender and receiver
// (sealing and opening on workers) deliver every snapshot record intact
// and in order.
func TestResyncOverParallelLinkArrivesInOrder(t *testing.T) {
	const records = 24
	rep, _ := resyncOverLoopback(t, records, true)
	rep.mu.Lock()
	defer rep.mu.Unlock()
	if len(rep.order) != records {
		t.Fatalf("%d records applied of %d", len(rep.order), records)
	}
	want := make([]byte, resyncChunk)
	for i, idx := range rep.order {
		fillPattern(want, i)
		if idx != uint64(i) || rep.sums[idx] != crc32.Checksum(want, castagnoli) {
			t.Fatalf("record %d applied as record %d, or with other bytes", i, idx)
		}
	}
}

// TestReceiverRefusesReorderedOrReplayedBulkFrames: large frames opened on
// workers are still bound to their place in the stream: a reordered or a
// replayed frame ends the link, and nothing from it on is applied, even
// frames after it that authenticate.
func TestReceiverRefusesReorderedOrReplayedBulkFrames(t *testing.T) {
	for _, tc := range []struct {
		name  string
		order []int // frames sent, by counter
		keep  int   // records applied before the bad frame
	}{
		{"in order", []int{0, 1, 2, 3, 4, 5}, 6},
		{"swapped", []int{0, 1, 3, 2, 4, 5}, 2},
		{"replayed", []int{0, 1, 1, 2, 3, 4}, 2},
		{"dropped", []int{0, 2, 3, 4, 5}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			applied := streamFrames(t, tc.order)
			if len(applied) != tc.keep {
				t.Fatalf("applied records %v, want the first %d", applied, tc.keep)
			}
			for i, idx := range applied {
				if idx != uint64(i) {
					t.Fatalf("applied records %v, want the first %d in order", applied, tc.keep)
				}
			}
		})
	}
}

// streamFrames seals six snapshot records of 1 MiB (whole frames,
// opened on workers), sends their frames in order (by counter) to a real
// receiver's stream, and returns the records it applied once the link
// ended.
func streamFrames(t *testing.T, order []int) []uint64 {
	p, s := linkPair(t)
	var frames [][]byte
	for i := range 6 {
		frames = append(frames, capture(p, func() { writeSerial(p, patternRecord(i, link.PartBytes-recordHeader)) }))
	}
	var out [][]byte
	for _, i := range order {
		out = append(out, frames[i])
	}
	return receive(t, p, s, out).order
}

// linkPair returns two authenticated link ends over loopback TCP.
func linkPair(t *testing.T) (p, s *link.Conn) {
	p, s, perr, serr := linktest.Pair(t, testKey, testKey)
	if perr != nil || serr != nil {
		t.Fatal(perr, serr)
	}
	return p, s
}

// patternRecord is snapshot record i with a body of n pattern bytes,
// encoded.
func patternRecord(i, n int) []byte {
	body := make([]byte, n)
	fillPattern(body, i)
	return replicate.AppendRecord(nil, &replicate.Record{Op: replicate.OpMMIO, Result: uint64(i), Body: body})
}

// capture returns the bytes write puts on p's link (sealed under p's next
// counters) instead of sending them.
func capture(p *link.Conn, write func()) []byte {
	var buf bytes.Buffer
	p.SetWriter(&buf)
	write()
	p.Flush()
	return buf.Bytes()
}

// receive runs a real receiver's stream on s, sends it frames from p,
// then ends p's side, and returns the replica once the link ended (at a
// bad frame, or at the end of the frames). Every buffer lent must have
// come back by then.
func receive(t *testing.T, p, s *link.Conn, frames [][]byte) *summingReplica {
	t.Helper()
	rep := &summingReplica{sums: map[uint64]uint32{}, synced: make(chan struct{})}
	r, err := NewReceiver(ReceiverConfig{Key: testKey, Replica: rep, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	s.Lender = r.lender
	lr := &linkRun{r: r, l: s, log: r.cfg.Logger, kick: make(chan struct{}, 1), queue: make(chan applyItem, applyQueue)}
	ended := make(chan struct{})
	go func() { r.stream(lr); s.Raw.Close(); close(ended) }() // as serveConn does
	w := bufio.NewWriter(p.Raw)
	for _, f := range frames {
		if _, err := w.Write(f); err != nil {
			break // the receiver ended the link
		}
	}
	w.Flush()
	p.Raw.(*net.TCPConn).CloseWrite()
	<-ended
	lent := r.lender.Lent()
	if lent != 0 {
		t.Fatalf("%d bytes still lent after the link ended", lent)
	}
	rep.mu.Lock()
	defer rep.mu.Unlock()
	return rep
}

// partedFrames returns the frames of three records sealed in order on
// p: a small one (record 0), one of 3.5 MiB in parts (record 1: its
// beginning, then parts 1 to 4) and a small one (record 2).
func partedFrames(p *link.Conn) [][]byte {
	frames := [][]byte{capture(p, func() { writeSerial(p, patternRecord(0, 100)) })}
	enc := patternRecord(1, 7<<19)
	withTag := func(b []byte) []byte { return append(make([]byte, 0, len(b)+link.MacSize), b...) }
	frames = append(frames, capture(p, func() {
		p.Write(link.MsgRecordBegin, withTag(binary.LittleEndian.AppendUint64(nil, uint64(len(enc)))))
	}))
	for off := 0; off < len(enc); off += link.PartBytes {
		frames = append(frames, capture(p, func() { p.Write(link.MsgRecordPart, withTag(enc[off:min(off+link.PartBytes, len(enc))])) }))
	}
	return append(frames, capture(p, func() { writeSerial(p, patternRecord(2, 100)) }))
}

// TestRecordParts: a record sent in parts is applied once whole and in
// order, intact; a tampered, dropped, repeated, reordered, oversized or
// cut-off part ends the link, and neither that record nor anything after
// it is applied (every buffer lent for it comes back).
func TestRecordParts(t *testing.T) {
	tamper := func(f []byte) []byte { c := bytes.Clone(f); c[link.FrameHeader+1000] ^= 1; return refreshCRC(c) }
	oversize := func(f []byte) []byte {
		c := bytes.Clone(f)
		binary.LittleEndian.PutUint32(c[8:], link.PartBytes+1)
		return refreshCRC(c)
	}
	for _, tc := range []struct {
		name   string
		frames func(f [][]byte) [][]byte
		want   []uint64
	}{
		{"whole and in order", func(f [][]byte) [][]byte { return f }, []uint64{0, 1, 2}},
		{"tampered", func(f [][]byte) [][]byte { return [][]byte{f[0], f[1], f[2], tamper(f[3]), f[4], f[5], f[6]} }, []uint64{0}},
		{"dropped", func(f [][]byte) [][]byte { return [][]byte{f[0], f[1], f[2], f[4], f[5], f[6]} }, []uint64{0}},
		{"repeated", func(f [][]byte) [][]byte { return [][]byte{f[0], f[1], f[2], f[3], f[3], f[4], f[5], f[6]} }, []uint64{0}},
		{"reordered", func(f [][]byte) [][]byte { return [][]byte{f[0], f[1], f[2], f[4], f[3], f[5], f[6]} }, []uint64{0}},
		{"oversized", func(f [][]byte) [][]byte { return [][]byte{f[0], f[1], f[2], oversize(f[3])} }, []uint64{0}},
		{"cut off", func(f [][]byte) [][]byte { return [][]byte{f[0], f[1], f[2], f[3], f[4][:len(f[4])/2]} }, []uint64{0}},
		{"cut off between parts", func(f [][]byte) [][]byte { return f[:4] }, []uint64{0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, s := linkPair(t)
			rep := receive(t, p, s, tc.frames(partedFrames(p)))
			if !slices.Equal(rep.order, tc.want) {
				t.Fatalf("applied records %v, want %v", rep.order, tc.want)
			}
			for _, i := range rep.order {
				want := mustDecode(t, patternRecord(int(i), []int{100, 7 << 19, 100}[i]))
				if rep.sums[i] != crc32.Checksum(want.Body, castagnoli) {
					t.Fatalf("record %d applied with other bytes", i)
				}
			}
		})
	}
}

// mustDecode decodes an encoding the test made.
func mustDecode(t *testing.T, enc []byte) replicate.Record {
	r, err := replicate.DecodeRecord(enc)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestRecordPartsOutOfShape: authentic frames (sealed with the key, in
// counter order) that break the parts' shape end the link before
// anything of the record is applied, and no buffer is lent for a size
// out of bounds.
func TestRecordPartsOutOfShape(t *testing.T) {
	withTag := func(b []byte) []byte { return append(make([]byte, 0, len(b)+link.MacSize), b...) }
	size := func(n uint64) []byte { return withTag(binary.LittleEndian.AppendUint64(nil, n)) }
	part := func(n int) []byte { return withTag(make([]byte, n)) }
	small := func(i int) []byte { return withTag(patternRecord(i, 100)) }
	type frame struct {
		typ     uint16
		payload []byte
	}
	for _, tc := range []struct {
		name   string
		frames []frame
	}{
		{"part without a beginning", []frame{{link.MsgRecordPart, part(link.PartBytes)}}},
		{"record inside parts", []frame{{link.MsgRecordBegin, size(3 << 20)}, {link.MsgRecordPart, part(link.PartBytes)}, {link.MsgRecord, small(1)}}},
		{"beginning inside parts", []frame{{link.MsgRecordBegin, size(3 << 20)}, {link.MsgRecordPart, part(link.PartBytes)}, {link.MsgRecordBegin, size(3 << 20)}}},
		{"heartbeat inside parts", []frame{{link.MsgRecordBegin, size(3 << 20)}, {link.MsgHeartbeat, withTag(make([]byte, 8))}}},
		{"size over the bound", []frame{{link.MsgRecordBegin, size(link.MaxRecordBytes + 1)}, {link.MsgRecordPart, part(link.PartBytes)}}},
		{"size of 2^64-1", []frame{{link.MsgRecordBegin, size(^uint64(0))}}},
		{"size that fits one frame", []frame{{link.MsgRecordBegin, size(link.PartBytes)}, {link.MsgRecordPart, part(link.PartBytes)}}},
		{"beginning of 4 bytes", []frame{{link.MsgRecordBegin, withTag(make([]byte, 4))}}},
		{"short part", []frame{{link.MsgRecordBegin, size(3 << 20)}, {link.MsgRecordPart, part(link.PartBytes / 2)}}},
		{"last part too long", []frame{{link.MsgRecordBegin, size(link.PartBytes + 10)}, {link.MsgRecordPart, part(link.PartBytes)}, {link.MsgRecordPart, part(11)}}},
		{"whole record over link.PartBytes", []frame{{link.MsgRecord, withTag(patternRecord(1, link.PartBytes))}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, s := linkPair(t)
			frames := [][]byte{capture(p, func() { p.Write(link.MsgRecord, small(0)) })}
			for _, f := range tc.frames {
				frames = append(frames, capture(p, func() { p.Write(f.typ, f.payload) }))
			}
			frames = append(frames, capture(p, func() { p.Write(link.MsgRecord, small(2)) }))
			rep := receive(t, p, s, frames)
			if !slices.Equal(rep.order, []uint64{0}) {
				t.Fatalf("applied records %v, want [0]", rep.order)
			}
		})
	}
}

// refreshCRC recomputes a frame's CRC, as an attacker who edits a frame can:
// only the AEAD tag stands in the way.
func refreshCRC(f []byte) []byte {
	binary.LittleEndian.PutUint32(f[12:], link.FrameCRC(f, f[link.FrameHeader:]))
	return f
}
