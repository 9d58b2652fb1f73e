package receiver

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/replicate"
)

// gatedReplica applies records as they come, except that it holds the
// record numbered hold (saying so on held) until release is closed.
type gatedReplica struct {
	discardReplica
	hold          uint64
	held, release chan struct{}
}

func (g *gatedReplica) Apply(r *replicate.Record) error {
	if r.Seq == g.hold {
		close(g.held)
		<-g.release
	}
	return nil
}

// TestApplierAcksThroughABacklog: a standby working through a backlog has
// an ack sent each ackEveryBytes it applies, not only once its queue is
// empty: the primary's guests that wait for log space go on meanwhile.
func TestApplierAcksThroughABacklog(t *testing.T) {
	const n = 8
	g := &gatedReplica{hold: 3, held: make(chan struct{}), release: make(chan struct{})}
	r, err := NewReceiver(ReceiverConfig{Key: testKey, Replica: g, AckInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	r.mode = replicate.ModeCommit
	lr := &linkRun{r: r, kick: make(chan struct{}, 1), queue: make(chan applyItem, n)}
	for i := uint64(1); i <= n; i++ {
		lr.queue <- applyItem{rec: replicate.Record{Seq: i, Op: replicate.OpMMIO, Body: make([]byte, ackEveryBytes/2)}}
	}
	done := make(chan struct{})
	go lr.applier(done)
	<-g.held // records 1 and 2 applied, 3 being applied, 4... queued
	if len(lr.kick) == 0 {
		t.Fatalf("no ack asked for after %d applied bytes with the queue still full", 2*ackEveryBytes/2)
	}
	close(g.release)
	close(lr.queue)
	<-done
	if st := r.Status(); st.Applied != n {
		t.Fatalf("applied %d of %d", st.Applied, n)
	}
}

// laneReplica notes the order it applies records in, per session, and
// holds session hold's record numbered holdSeq until release is closed. It
// fails the test if a record that is not one session's is applied while
// another apply is under way, or before every record ahead of it.
type laneReplica struct {
	discardReplica
	t             *testing.T
	holdSeq       uint64
	held, release chan struct{}
	applied       chan uint64 // every record applied, as it is
	mu            sync.Mutex
	active        int
	order         map[uint64][]uint64 // by session
	done          map[uint64]bool
}

func (l *laneReplica) Apply(r *replicate.Record) error {
	l.mu.Lock()
	l.active++
	if !r.Op.SessionScoped() {
		if l.active != 1 {
			l.t.Errorf("%s (record %d) applied beside %d other applies", r.Op, r.Seq, l.active-1)
		}
		for seq := uint64(1); seq < r.Seq; seq++ {
			if !l.done[seq] {
				l.t.Errorf("%s (record %d) applied before record %d", r.Op, r.Seq, seq)
			}
		}
	}
	l.mu.Unlock()
	if r.Seq == l.holdSeq {
		close(l.held)
		<-l.release
	}
	l.mu.Lock()
	l.active--
	l.order[r.Session] = append(l.order[r.Session], r.Seq)
	l.done[r.Seq] = true
	l.mu.Unlock()
	l.applied <- r.Seq
	return nil
}

// TestLanesApplySessionsSideBySide: with ParallelSessions, one session's
// slow record holds back neither another session's records nor the ack
// of what was applied before it, and never its own session's later
// records; the applied position never passes it; a session's close waits
// for every record before it, and applies alone.
func TestLanesApplySessionsSideBySide(t *testing.T) {
	mmio := replicate.OpMMIO
	log := []replicate.Record{
		{Seq: 1, Session: 1, Op: mmio}, {Seq: 2, Session: 1, Op: mmio}, {Seq: 3, Session: 2, Op: mmio},
		{Seq: 4, Session: 2, Op: mmio}, {Seq: 5, Session: 1, Op: mmio}, {Seq: 6, Session: 2, Op: mmio},
		{Seq: 7, Session: 2, Op: replicate.OpSessionClose}, {Seq: 8, Session: 1, Op: mmio},
	}
	l := &laneReplica{t: t, holdSeq: 2, held: make(chan struct{}), release: make(chan struct{}),
		applied: make(chan uint64, len(log)), order: map[uint64][]uint64{}, done: map[uint64]bool{}}
	r, err := NewReceiver(ReceiverConfig{Key: testKey, Replica: l, AckInterval: time.Hour, ParallelSessions: true})
	if err != nil {
		t.Fatal(err)
	}
	r.mode = replicate.ModeCommit
	lr := &linkRun{r: r, kick: make(chan struct{}, 1), queue: make(chan applyItem, len(log))}
	lr.queue <- applyItem{rec: log[0]}
	lr.queue <- applyItem{rec: log[1]}
	done := make(chan struct{})
	go lr.applier(done)
	<-l.held
	for deadline := time.Now().Add(10 * time.Second); r.Status().Applied < 1 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	for _, rec := range log[2:] {
		lr.queue <- applyItem{rec: rec}
	}
	got := map[uint64]bool{}
	for len(got) < 4 { // 1, then session 2's 3, 4 and 6 beside the held 2
		select {
		case seq := <-l.applied:
			got[seq] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("session 2's records were not applied while session 1's record 2 was held: applied %v", got)
		}
	}
	if !got[1] || !got[3] || !got[4] || !got[6] {
		t.Fatalf("applied %v while record 2 was held, want 1, 3, 4 and 6", got)
	}
	time.Sleep(50 * time.Millisecond) // the lanes' completions of 3, 4 and 6 reach the applier
	if st := r.Status(); st.Applied != 1 {
		t.Fatalf("applied position %d while record 2 is being applied, want 1", st.Applied)
	}
	close(l.release)
	close(lr.queue)
	<-done
	if st := r.Status(); st.Applied != uint64(len(log)) {
		t.Fatalf("applied %d of %d", st.Applied, len(log))
	}
	want := map[uint64][]uint64{1: {1, 2, 5, 8}, 2: {3, 4, 6, 7}}
	for s, seqs := range want {
		if !slices.Equal(l.order[s], seqs) {
			t.Errorf("session %d applied %v, want %v in log order", s, l.order[s], seqs)
		}
	}
}

// TestLanesOffApplyInTurn: without ParallelSessions a held record holds
// every record after it, whichever its session.
func TestLanesOffApplyInTurn(t *testing.T) {
	l := &laneReplica{t: t, holdSeq: 1, held: make(chan struct{}), release: make(chan struct{}),
		applied: make(chan uint64, 2), order: map[uint64][]uint64{}, done: map[uint64]bool{}}
	r, err := NewReceiver(ReceiverConfig{Key: testKey, Replica: l, AckInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	r.mode = replicate.ModeCommit
	lr := &linkRun{r: r, kick: make(chan struct{}, 1), queue: make(chan applyItem, 2)}
	lr.queue <- applyItem{rec: replicate.Record{Seq: 1, Session: 1, Op: replicate.OpMMIO}}
	lr.queue <- applyItem{rec: replicate.Record{Seq: 2, Session: 2, Op: replicate.OpMMIO}}
	done := make(chan struct{})
	go lr.applier(done)
	<-l.held
	select {
	case seq := <-l.applied:
		t.Fatalf("record %d applied while record 1 was held", seq)
	case <-time.After(100 * time.Millisecond):
	}
	close(l.release)
	close(lr.queue)
	<-done
	if !slices.Equal(l.order[2], []uint64{2}) || r.Status().Applied != 2 {
		t.Fatalf("order %v, applied %d", l.order, r.Status().Applied)
	}
}

// TestLanesManyRecords: more records than a lane's queue and than may be
// in flight, three sessions interleaved unevenly: each session's applied
// in log order, and the applied position reaches the end.
func TestLanesManyRecords(t *testing.T) {
	const n = 3*maxInFlight + 17
	l := &laneReplica{t: t, applied: make(chan uint64, n), order: map[uint64][]uint64{}, done: map[uint64]bool{}}
	r, err := NewReceiver(ReceiverConfig{Key: testKey, Replica: l, AckInterval: time.Hour, ParallelSessions: true})
	if err != nil {
		t.Fatal(err)
	}
	r.mode = replicate.ModeCommit
	lr := &linkRun{r: r, kick: make(chan struct{}, 1), queue: make(chan applyItem, 64)}
	done := make(chan struct{})
	go lr.applier(done)
	want := map[uint64][]uint64{}
	for seq := uint64(1); seq <= n; seq++ {
		s := []uint64{1, 1, 1, 2, 3}[seq%5]
		want[s] = append(want[s], seq)
		lr.queue <- applyItem{rec: replicate.Record{Seq: seq, Session: s, Op: replicate.OpMMIO}}
	}
	close(lr.queue)
	<-done
	if st := r.Status(); st.Applied != n {
		t.Fatalf("applied %d of %d", st.Applied, n)
	}
	for s, seqs := range want {
		if !slices.Equal(l.order[s], seqs) {
			t.Errorf("session %d: %d records applied, want %d in log order", s, len(l.order[s]), len(seqs))
		}
	}
}
