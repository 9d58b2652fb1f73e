package replicate

import (
	"bufio"
	"bytes"
	"hash/crc32"
	"io"
	"log/slog"
	"testing"
	"time"
)

// bulkPayloads are record encodings of mixed sizes: small ones sealed on
// the caller, large ones on workers.
func bulkPayloads() [][]byte {
	var out [][]byte
	for i, size := range []int{10, lendAbove, 3 << 20, 100, 1 << 20, sealApartFrom - 1, 2 << 20, 5} {
		body := make([]byte, size)
		fillPattern(body, i)
		out = append(out, AppendRecord(nil, &Record{Op: OpMMIO, Flags: FlagPlaced, Result: uint64(i), Body: body}))
	}
	return out
}

// TestBulkStreamIsTheSerialStream: frames sealed on several workers, in
// place (a snapshot's) or into the writer's buffers (live records), go on
// the wire byte for byte as the same frames sealed one after another:
// same counters (nonces), same order.
func TestBulkStreamIsTheSerialStream(t *testing.T) {
	key := bytes.Repeat([]byte("k"), 32)
	var serial, parallel bytes.Buffer
	ls := newLink(nil, nil, key, key)
	ls.w.Reset(&serial)
	lp := newLink(nil, nil, key, key)
	lp.w.Reset(&parallel)
	bw := &bulkWriter{l: lp, frames: newInOrder(4)}
	bw.bufs = make(chan []byte, 2)
	bw.bufs <- nil
	bw.bufs <- nil
	given := 0
	var kept [][]byte // payloads sealed by writeCopy, which must not change
	for round := range 4 {
		for _, p := range bulkPayloads() {
			if err := ls.write(msgRecord, append(make([]byte, 0, len(p)+macSize), p...)); err != nil {
				t.Fatal(err)
			}
			if round%2 == 1 { // live records: the log's copy stays
				kept = append(kept, p)
				if err := bw.writeCopy(msgRecord, p, func() { given++ }); err != nil {
					t.Fatal(err)
				}
				continue
			}
			frame := append(make([]byte, frameHeader, frameHeader+len(p)+macSize), p...)
			if err := bw.write(msgRecord, frame, func() { given++ }); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := bw.close(); err != nil {
		t.Fatal(err)
	}
	for i, p := range kept {
		if !bytes.Equal(p, bulkPayloads()[i%len(bulkPayloads())]) {
			t.Fatalf("writeCopy changed payload %d", i)
		}
	}
	ls.flush()
	lp.flush()
	if given != 4*len(bulkPayloads()) {
		t.Fatalf("%d frames given back of %d", given, 4*len(bulkPayloads()))
	}
	if !bytes.Equal(serial.Bytes(), parallel.Bytes()) {
		t.Fatalf("the parallel stream (%d bytes) differs from the serial one (%d bytes)", parallel.Len(), serial.Len())
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

// streamFrames seals six 1 MiB snapshot records, sends their frames in
// order (by counter) to a real receiver's stream, and returns the records
// it applied once the link ended.
func streamFrames(t *testing.T, order []int) []uint64 {
	p, s, perr, serr := pair(t, testKey, testKey)
	if perr != nil || serr != nil {
		t.Fatal(perr, serr)
	}
	var frames [][]byte
	for i := range 6 {
		body := make([]byte, 1<<20)
		fillPattern(body, i)
		var buf bytes.Buffer
		p.w.Reset(&buf)
		p.write(msgRecord, AppendRecord(make([]byte, 0, recordHeader+len(body)+macSize), &Record{Op: OpMMIO, Result: uint64(i), Body: body}))
		p.flush()
		frames = append(frames, buf.Bytes())
	}
	rep := &summingReplica{sums: map[uint64]uint32{}, synced: make(chan struct{})}
	r, err := NewReceiver(ReceiverConfig{Key: testKey, Replica: rep, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	s.lender = r.lender
	lr := &linkRun{r: r, l: s, log: r.cfg.Logger, kick: make(chan struct{}, 1), queue: make(chan applyItem, applyQueue)}
	ended := make(chan struct{})
	go func() { r.stream(lr); close(ended) }()
	w := bufio.NewWriter(p.c)
	for _, i := range order {
		w.Write(frames[i])
	}
	w.Flush()
	select {
	case <-ended: // a bad frame ended the link
	case <-time.After(time.Second): // every frame was good: the link waits for more
		p.c.Close()
		<-ended
	}
	rep.mu.Lock()
	defer rep.mu.Unlock()
	return rep.order
}
