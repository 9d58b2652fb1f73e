package receiver

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/replicate"
	"github.com/vgpuha/vgpuha/replicate/verify"
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

func (p *patternSnapshot) Next(body []byte) (replicate.Record, bool, error) {
	if p.sent == p.records {
		if p.ended {
			return replicate.Record{}, false, nil
		}
		p.ended = true
		return replicate.Record{Op: replicate.OpSnapshotEnd, Result: p.at}, true, nil
	}
	body = body[:resyncChunk]
	fillPattern(body, p.sent)
	p.sent++
	return replicate.Record{Op: replicate.OpMMIO, Flags: replicate.FlagPlaced, Result: uint64(p.sent - 1), Body: body}, true, nil
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
	log     *replicate.Log
	records int
}

func (n *patternNode) Snapshot() (replicate.Snapshot, error) {
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

func (s *summingReplica) Apply(r *replicate.Record) error {
	if r.Op == replicate.OpMMIO {
		s.mu.Lock()
		s.sums[r.Result] = crc32.Checksum(r.Body, castagnoli)
		s.order = append(s.order, r.Result)
		s.mu.Unlock()
	}
	return nil
}
func (s *summingReplica) Checksums() []verify.ObjectSum { return nil }
func (s *summingReplica) Heard(uint64)                  {}
func (s *summingReplica) HandOver() (uint64, bool)      { return 0, false }
func (s *summingReplica) Synced(in bool) {
	if in {
		close(s.synced)
	}
}

// runLink starts a real Receiver applying to rep and a real replicate.Sender of lg
// protecting node, over loopback TCP, and returns what stops both (the
// sender ends once its context is done and its link dropped).
func runLink(tb testing.TB, mode replicate.Mode, rep Replica, lg *replicate.Log, node replicate.Protected) (stop func()) {
	tb.Helper()
	return runLinkWith(tb, mode, rep, lg, node, nil)
}

// runLinkWith is runLink with hostBuffer as the receiver's HostBuffer.
func runLinkWith(tb testing.TB, mode replicate.Mode, rep Replica, lg *replicate.Log, node replicate.Protected, hostBuffer func(int) []byte) (stop func()) {
	tb.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	r, err := NewReceiver(ReceiverConfig{Key: testKey, Replica: rep, Logger: quiet, HostBuffer: hostBuffer})
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	go r.Serve(ln)
	s, err := replicate.NewSender(replicate.SenderConfig{Addr: ln.Addr().String(), Key: testKey, Mode: mode, Log: lg, Logger: quiet}, node)
	if err != nil {
		ln.Close()
		r.Close()
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	return func() { cancel(); lg.Close(); ln.Close(); r.Close(); <-done }
}

// resyncOverLoopback runs a real sender and receiver over loopback TCP
// until the standby applied a snapshot of records 4 MiB records, and
// returns the replica and how long the snapshot took.
func resyncOverLoopback(tb testing.TB, records int, withSums bool) (*summingReplica, time.Duration) {
	tb.Helper()
	rep := &summingReplica{sums: map[uint64]uint32{}, synced: make(chan struct{})}
	var applier Replica = rep
	if !withSums {
		applier = &countingReplica{synced: rep.synced}
	}
	lg := replicate.NewLog(64 << 20)
	start := time.Now()
	stop := runLink(tb, replicate.ModeCommit, applier, lg, &patternNode{log: lg, records: records})
	defer stop()
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

func (c *countingReplica) Apply(*replicate.Record) error { return nil }
func (c *countingReplica) Synced(in bool) {
	if in {
		close(c.synced)
	}
}

// BenchmarkResyncLink: a 256 MiB snapshot, sealed by a real replicate.Sender and
// opened by a real Receiver over loopback TCP (AES-GCM, 4 MiB records),
// applied to a replica that keeps nothing; beside it, the same bytes over
// a plain loopback TCP connection (raw-MB/s) and the link's rate as a
// fraction of that (x-raw; the link's time includes its handshake and
// snapshot setup). Run with -cpu 1,2,4,8.
func BenchmarkResyncLink(b *testing.B) {
	const records = 64
	b.SetBytes(records * resyncChunk)
	var link, raw time.Duration
	for b.Loop() {
		_, took := resyncOverLoopback(b, records, false)
		link += took
		b.StopTimer()
		raw += rawLoopback(b, records*resyncChunk, resyncChunk)
		b.StartTimer()
	}
	reportRaw(b, records*resyncChunk*int64(b.N), link, raw)
}

// rawLoopback pushes total bytes, in writes of chunk bytes, over a plain
// loopback TCP connection (no handshake, no crypto) and returns how long
// the reader took to get them all: the link's ceiling on this host.
func rawLoopback(tb testing.TB, total, chunk int) time.Duration {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	got := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- err
			return
		}
		defer c.Close()
		_, err = io.CopyBuffer(io.Discard, io.LimitReader(c, int64(total)), make([]byte, 1<<20))
		got <- err
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, chunk)
	fillPattern(buf, 1)
	start := time.Now()
	for sent := 0; sent < total; sent += chunk {
		if _, err := c.Write(buf[:min(chunk, total-sent)]); err != nil {
			tb.Fatal(err)
		}
	}
	if err := <-got; err != nil {
		tb.Fatal(err)
	}
	return time.Since(start)
}

// reportRaw reports the raw leg beside the link's own rate: raw-MB/s, and
// x-raw, the link's rate as a fraction of it.
func reportRaw(b *testing.B, bytes int64, link, raw time.Duration) {
	linkRate := float64(bytes) / link.Seconds() / 1e6
	rawRate := float64(bytes) / raw.Seconds() / 1e6
	b.ReportMetric(rawRate, "raw-MB/s")
	b.ReportMetric(linkRate/rawRate, "x-raw")
}

// liveOverLoopback starts a real sender and receiver over loopback TCP,
// the sender protecting an empty node, and returns its log once the
// standby protects it (records appended from then on go out live).
func liveOverLoopback(tb testing.TB, mode replicate.Mode, rep Replica) *replicate.Log {
	tb.Helper()
	lg := replicate.NewLog(256 << 20)
	tb.Cleanup(runLink(tb, mode, rep, lg, &patternNode{log: lg}))
	for deadline := time.Now().Add(time.Minute); !lg.Status().Protected; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			tb.Fatal("the standby did not protect the log within a minute")
		}
	}
	return lg
}

// liveMix is what one BenchmarkLiveLink iteration appends: records of
// body bytes making up about 256 MiB, each followed by a few small ones
// (a guest's launches and syncs between its copies).
func liveMix(body int) (large, small []replicate.Record, total int64) {
	b := make([]byte, body)
	fillPattern(b, 7)
	rec := replicate.Record{Session: 1, Op: replicate.OpMMIO, Body: b}
	n := max(1, (256<<20)/body)
	for range n {
		large = append(large, rec)
	}
	small = []replicate.Record{{Session: 1, Op: replicate.OpMMIO, Body: make([]byte, 64)}, {Session: 1, Op: replicate.OpMMIO, Body: make([]byte, 200)}}
	total = int64(n) * int64(rec.Size()+small[0].Size()+small[1].Size())
	return large, small, total
}

// BenchmarkLiveLink: live records (large bodies, small ones between them)
// appended to the log of a real replicate.Sender and applied by a real Receiver
// over loopback TCP (AES-GCM), timed until the standby applied the last;
// beside it, the same bytes over a plain loopback TCP connection
// (raw-MB/s) and the link's rate as a fraction of that (x-raw). Run with
// -cpu 1,2,4.
func BenchmarkLiveLink(b *testing.B) {
	// 64 MiB records go in parts (protocol 4); before it, a record frame
	// was bounded by maxFrameBytes (32 MiB).
	for _, body := range []int{256 << 10, 4 << 20, 16 << 20, 64 << 20} {
		b.Run(fmt.Sprintf("body=%dKiB", body>>10), func(b *testing.B) {
			lg := liveOverLoopback(b, replicate.ModeAsync, discardReplica{})
			large, small, total := liveMix(body)
			b.SetBytes(total)
			var link, raw time.Duration
			for b.Loop() {
				start := time.Now()
				for i := range large {
					lg.Append(large[i])
					for _, s := range small {
						lg.Append(s)
					}
				}
				if !lg.WaitApplied(lg.Last()) {
					b.Fatal("the standby dropped out")
				}
				link += time.Since(start)
				b.StopTimer()
				raw += rawLoopback(b, int(total), body)
				b.StartTimer()
			}
			reportRaw(b, total*int64(b.N), link, raw)
		})
	}
}

// BenchmarkLiveSmallRoundTrip: one small record appended and applied by
// the standby (sync mode: the guest's reply waits for this), one at a
// time: the latency the live path adds to a small synchronous call.
func BenchmarkLiveSmallRoundTrip(b *testing.B) {
	lg := liveOverLoopback(b, replicate.ModeSync, discardReplica{})
	rec := replicate.Record{Session: 1, Op: replicate.OpMMIO, Body: make([]byte, 64)}
	for b.Loop() {
		if !lg.WaitApplied(lg.Append(rec)) {
			b.Fatal("the standby dropped out")
		}
	}
}
