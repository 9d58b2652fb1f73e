package receiver

import (
	"hash/crc32"
	"sync"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/replicate"
	"github.com/vgpuha/vgpuha/replicate/link"
)

// settlingReplica stands for a GPU replica whose copies stay queued on the
// device until settled: it keeps each applied record's body where it lies
// (the receive buffer a queued copy would still read) and, when a mark
// covering it is settled, checks that none of those bytes changed
// meanwhile.
type settlingReplica struct {
	summingReplica
	pending  [][]byte // bodies applied since the last mark
	sums     []uint32 // their checksums when applied
	marks    []markedRun
	lastMark uint64
	settles  int
	mostHeld int // the most body bytes applied and not settled, at a Settle
	changed  int // bodies found changed when settled
}

// markedRun is the bodies applied before a mark.
type markedRun struct {
	mark   uint64
	bodies [][]byte
	sums   []uint32
}

func (s *settlingReplica) Apply(r *replicate.Record) error {
	if r.Op == replicate.OpMMIO {
		time.Sleep(time.Millisecond) // slower than the link: it reads ahead into every buffer it may lend
		s.mu.Lock()
		s.pending = append(s.pending, r.Body)
		s.sums = append(s.sums, crc32.Checksum(r.Body, castagnoli))
		s.mu.Unlock()
	}
	return s.summingReplica.Apply(r)
}

func (s *settlingReplica) Mark() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastMark++
	s.marks = append(s.marks, markedRun{mark: s.lastMark, bodies: s.pending, sums: s.sums})
	s.pending, s.sums = nil, nil
	return s.lastMark
}

func (s *settlingReplica) Settle(upTo uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	held := 0
	for _, run := range s.marks {
		for _, b := range run.bodies {
			held += len(b)
		}
	}
	for _, b := range s.pending {
		held += len(b)
	}
	s.mostHeld = max(s.mostHeld, held)
	for len(s.marks) > 0 && s.marks[0].mark <= upTo {
		run := s.marks[0]
		s.marks = s.marks[1:]
		for i, b := range run.bodies {
			if crc32.Checksum(b, castagnoli) != run.sums[i] {
				s.changed++
			}
		}
		s.settles++
	}
	return nil
}

// TestReceiverKeepsBuffersUntilSettled: a replica that queues copies
// (Settler) finds every record's bytes as they arrived until their run is
// settled, although the link reads on into every buffer given back; the
// applier never holds much more than two runs, and settles all when the
// stream ends.
// Both ways a receiver lends buffers: from the heap, and carved from one
// region (as page-locked memory is on a GPU standby).
func TestReceiverKeepsBuffersUntilSettled(t *testing.T) {
	t.Run("heap", func(t *testing.T) { testKeepsBuffersUntilSettled(t, nil) })
	t.Run("region", func(t *testing.T) {
		testKeepsBuffersUntilSettled(t, func(n int) []byte { return make([]byte, n) })
	})
}

func testKeepsBuffersUntilSettled(t *testing.T, hostBuffer func(int) []byte) {
	const records = 80 // 320 MiB of 4 MiB records: more than maxLentBytes, so buffers are reused
	rep := &settlingReplica{summingReplica: summingReplica{sums: map[uint64]uint32{}, synced: make(chan struct{})}}
	lg := replicate.NewLog(64 << 20)
	stop := runLinkWith(t, replicate.ModeCommit, rep, lg, &patternNode{log: lg, records: records}, hostBuffer)
	select {
	case <-rep.synced:
	case <-time.After(2 * time.Minute):
		t.Fatal("the snapshot was not applied within 2 minutes")
	}
	stop()
	waitSettled(t, &rep.mu, func() bool { return len(rep.pending)+len(rep.marks) == 0 })
	rep.mu.Lock()
	defer rep.mu.Unlock()
	if len(rep.order) != records {
		t.Fatalf("%d records applied of %d", len(rep.order), records)
	}
	if rep.changed != 0 {
		t.Fatalf("%d record bodies changed before the replica settled them", rep.changed)
	}
	// A run closes at the buffer that takes it to settleEveryBytes: two
	// runs hold at most that and one more buffer each.
	if most := 2 * (settleEveryBytes + 4<<20); rep.settles < 2 || rep.mostHeld > most {
		t.Fatalf("%d runs settled, at most %d bytes held at once: want several, never over %d", rep.settles, rep.mostHeld, most)
	}
}

// waitSettled waits up to a minute for done, checked under mu.
func waitSettled(t *testing.T, mu *sync.Mutex, done func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(5 * time.Millisecond) {
		mu.Lock()
		ok := done()
		mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the applier never settled the last records")
		}
	}
}

// crcReplica checks each guest record's BodyCRC against its body, and
// counts those whose sum the receiver took on a worker.
type crcReplica struct {
	summingReplica
	onWorker, wrong int
}

func (c *crcReplica) Apply(r *replicate.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.ReqID == 0 {
		return nil
	}
	if r.HasBodyCRC() {
		c.onWorker++
	}
	if r.BodyCRC() != crc32.Checksum(r.Body, castagnoli) {
		c.wrong++
	}
	return nil
}

// TestRecordSumsTakenOnWorkers: a guest request's record that arrives in a
// frame of its own (lendAbove or more) has its body's CRC-32C taken by the
// worker that opened it; every record's BodyCRC is right, taken there or
// not (small frames, records in parts, resync contents without a request).
func TestRecordSumsTakenOnWorkers(t *testing.T) {
	rep := &crcReplica{summingReplica: summingReplica{sums: map[uint64]uint32{}, synced: make(chan struct{})}}
	lg := liveOverLoopback(t, replicate.ModeSync, rep)
	sizes := []int{64, lendAbove, 256 << 10, link.PartBytes - recordHeader, 3 << 20, 100}
	for i, n := range sizes {
		body := make([]byte, n)
		fillPattern(body, i)
		if !lg.WaitApplied(lg.Append(replicate.Record{Session: 1, ReqID: uint64(i + 1), Op: replicate.OpMMIO, Body: body})) {
			t.Fatal("the standby dropped out")
		}
	}
	rep.mu.Lock()
	defer rep.mu.Unlock()
	if rep.wrong != 0 || rep.onWorker != 3 {
		t.Fatalf("%d wrong sums, %d taken on workers: want none wrong, 3 on workers (the frames of lendAbove up to link.PartBytes)", rep.wrong, rep.onWorker)
	}
}

// TestSmallRecordsBehindLargeOnesKeepOrder: small records read while large
// ones are still being opened on workers (each taking a buffer of its own
// and its turn) are applied in stream order with their bytes; a small one
// that fails to authenticate ends the link there, the records before it
// applied and none after.
func TestSmallRecordsBehindLargeOnesKeepOrder(t *testing.T) {
	for _, tamper := range []int{-1, 7} {
		p, s := linkPair(t)
		var frames [][]byte
		var bodies [][]byte
		for i := range 24 {
			n := 100
			if i%4 == 0 {
				n = 256 << 10 // a guest's copy, then three small calls
			}
			body := make([]byte, n)
			fillPattern(body, i)
			bodies = append(bodies, body)
			enc := replicate.AppendRecord(nil, &replicate.Record{Op: replicate.OpMMIO, Result: uint64(i), Body: body})
			frames = append(frames, capture(p, func() { writeSerial(p, enc) }))
		}
		if tamper >= 0 {
			frames[tamper][len(frames[tamper])-1] ^= 1 // its tag
			frames[tamper] = refreshCRC(frames[tamper])
		}
		rep := receive(t, p, s, frames)
		want := len(frames)
		if tamper >= 0 {
			want = tamper
		}
		if len(rep.order) != want {
			t.Fatalf("tampered %d: %d records applied, want %d", tamper, len(rep.order), want)
		}
		for i, idx := range rep.order {
			if idx != uint64(i) || rep.sums[idx] != crc32.Checksum(bodies[i], castagnoli) {
				t.Fatalf("tampered %d: record %d applied as record %d, or with other bytes", tamper, i, idx)
			}
		}
	}
}

// TestLiveRecordsInRegionKeptUntilSettled: a guest's stream of 256 KiB
// copies with small calls between them, received into a page-locked
// region as a ring (many times what the region holds): every body is as it arrived when its run is settled, and every
// record is applied once, in order.
func TestLiveRecordsInRegionKeptUntilSettled(t *testing.T) {
	const copies = 1100 // 275 MiB
	rep := &settlingReplica{summingReplica: summingReplica{sums: map[uint64]uint32{}, synced: make(chan struct{})}}
	lg := replicate.NewLog(64 << 20)
	// A region of 40 MiB (a HostBuffer may give less than asked): its
	// space is reused every 40 MiB, soon after a run is marked.
	stop := runLinkWith(t, replicate.ModeAsync, rep, lg, &patternNode{log: lg}, func(int) []byte { return make([]byte, 40<<20) })
	defer stop()
	select {
	case <-rep.synced:
	case <-time.After(time.Minute):
		t.Fatal("the standby did not attach within a minute")
	}
	want := 0
	for i := range copies {
		body := make([]byte, 256<<10)
		fillPattern(body, i)
		lg.Append(replicate.Record{Session: 1, Op: replicate.OpMMIO, Result: uint64(want), Body: body})
		want++
		if i%3 == 0 {
			lg.Append(replicate.Record{Session: 1, Op: replicate.OpMMIO, Result: uint64(want), Body: []byte{byte(i), 1, 2}})
			want++
		}
	}
	waitSettled(t, &rep.mu, func() bool { return len(rep.order) == want && len(rep.pending)+len(rep.marks) == 0 })
	rep.mu.Lock()
	defer rep.mu.Unlock()
	for i, r := range rep.order {
		if r != uint64(i) {
			t.Fatalf("record %d applied in place %d", r, i)
		}
	}
	if rep.changed != 0 {
		t.Fatalf("%d record bodies changed before the replica settled them", rep.changed)
	}
	if rep.settles < 2 {
		t.Fatalf("%d runs settled: want several", rep.settles)
	}
}
