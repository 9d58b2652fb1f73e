package replicate

import (
	"context"
	"encoding/binary"
	"hash/crc32"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"
)

// patternSnapshot is a resync snapshot of records × resyncChunk bytes of
// a checkable pattern (each record's bytes depend on its index), read into
// the frame as a backend reads device memory into it.
type patternSnapshot struct {
	at      uint64
	records int
	sent    int
	ended   bool
}

func (p *patternSnapshot) At() uint64           { return p.at }
func (p *patternSnapshot) Pause() time.Duration { return 0 }
func (p *patternSnapshot) Close()               {}

func (p *patternSnapshot) Progress() (uint64, uint64) {
	return uint64(p.sent) * resyncChunk, uint64(p.records) * resyncChunk
}

func (p *patternSnapshot) Next(body []byte) (Record, bool, error) {
	if p.sent == p.records {
		if p.ended {
			return Record{}, false, nil
		}
		p.ended = true
		return Record{Op: OpSnapshotEnd, Result: p.at}, true, nil
	}
	body = body[:resyncChunk]
	fillPattern(body, p.sent)
	p.sent++
	return Record{Op: OpMMIO, Flags: FlagPlaced, Result: uint64(p.sent - 1), Body: body}, true, nil
}

// fillPattern writes record i's bytes.
func fillPattern(b []byte, i int) {
	for o := 0; o+8 <= len(b); o += 8 {
		binary.LittleEndian.PutUint64(b[o:], uint64(i)<<32|uint64(o))
	}
}

// patternNode is the primary a benchmark sender protects: its snapshot is
// a patternSnapshot.
type patternNode struct {
	log     *Log
	records int
}

func (n *patternNode) Snapshot() (Snapshot, error) {
	return &patternSnapshot{at: n.log.BeginSnapshot(), records: n.records}, nil
}
func (n *patternNode) Term() uint64    { return 1 }
func (n *patternNode) PeerTerm(uint64) {}

// summingReplica records, per snapshot record, the CRC of its body and
// says when the snapshot ended.
type summingReplica struct {
	mu     sync.Mutex
	sums   map[uint64]uint32
	order  []uint64
	synced chan struct{}
}

func (s *summingReplica) Apply(r *Record) error {
	if r.Op == OpMMIO {
		s.mu.Lock()
		s.sums[r.Result] = crc32.Checksum(r.Body, castagnoli)
		s.order = append(s.order, r.Result)
		s.mu.Unlock()
	}
	return nil
}
func (s *summingReplica) Checksums() []ObjectSum   { return nil }
func (s *summingReplica) Heard(uint64)             {}
func (s *summingReplica) HandOver() (uint64, bool) { return 0, false }
func (s *summingReplica) Synced(in bool) {
	if in {
		close(s.synced)
	}
}

// resyncOverLoopback runs a real sender and receiver over loopback TCP
// until the standby applied a snapshot of records 4 MiB records, and
// returns the replica and how long the snapshot took.
func resyncOverLoopback(tb testing.TB, records int, withSums bool) (*summingReplica, time.Duration) {
	tb.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	rep := &summingReplica{sums: map[uint64]uint32{}, synced: make(chan struct{})}
	var applier Replica = rep
	if !withSums {
		applier = &countingReplica{synced: rep.synced}
	}
	r, err := NewReceiver(ReceiverConfig{Key: testKey, Replica: applier, Logger: quiet})
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	go r.Serve(ln)
	lg := NewLog(64 << 20)
	s, err := NewSender(SenderConfig{Addr: ln.Addr().String(), Key: testKey, Mode: ModeCommit, Log: lg, Logger: quiet},
		&patternNode{log: lg, records: records})
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	start := time.Now()
	go func() { s.Run(ctx); close(done) }()
	// The sender ends once its context is done and its link dropped.
	defer func() { cancel(); ln.Close(); r.Close(); <-done }()
	select {
	case <-rep.synced:
	case <-time.After(2 * time.Minute):
		tb.Fatal("the snapshot was not applied within 2 minutes")
	}
	return rep, time.Since(start)
}

// countingReplica applies nothing: a benchmark of the link alone.
type countingReplica struct {
	summingReplica
	synced chan struct{}
}

func (c *countingReplica) Apply(*Record) error { return nil }
func (c *countingReplica) Synced(in bool) {
	if in {
		close(c.synced)
	}
}

// BenchmarkResyncLink: a 256 MiB snapshot, sealed by a real Sender and
// opened by a real Receiver over loopback TCP (AES-GCM, 4 MiB records),
// applied to a replica that keeps nothing. Run with -cpu 1,2,4,8.
func BenchmarkResyncLink(b *testing.B) {
	const records = 64
	b.SetBytes(records * resyncChunk)
	for b.Loop() {
		resyncOverLoopback(b, records, false)
	}
}
