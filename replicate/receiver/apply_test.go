package receiver

import (
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/replicate"
	"github.com/vgpuha/vgpuha/replicate/verify"
)

// gatedReplica applies records as they come, except that it holds the
// record numbered hold (saying so on held) until release is closed.
type gatedReplica struct {
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
func (g *gatedReplica) Checksums() []verify.ObjectSum { return nil }
func (g *gatedReplica) Heard(uint64)                  {}
func (g *gatedReplica) Synced(bool)                   {}
func (g *gatedReplica) HandOver() (uint64, bool)      { return 0, false }

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
