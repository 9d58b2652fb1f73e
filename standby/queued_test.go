package standby_test

import (
	"hash/crc32"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/internal/lab/cluster"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/replicate"
)

// queueingBackend is the software GPU with a GPU replica's contract for
// queued copies (gpu.QueuedCopier): a queued copy may read its source any
// time until it is settled. The copy itself is done at once (so it keeps
// its place among the calls after it); what the source held then is
// checked again when the copy is settled, as a DMA engine would read it
// last. A standby that let a receive buffer go, to be read into again,
// before settling the copy that reads it is caught there.
type queueingBackend struct {
	gpu.Backend
	seen *queueSeen
}

// queueSeen counts, over every context, the copies settled and those
// whose source had changed by then.
type queueSeen struct {
	mu               sync.Mutex
	settled, changed int
}

func (b queueingBackend) NewContext(base, size uint64) (gpu.Context, error) {
	ctx, err := b.Backend.NewContext(base, size)
	if err != nil {
		return nil, err
	}
	return &queueingContext{Context: ctx, seen: b.seen}, nil
}

type queueingContext struct {
	gpu.Context
	seen   *queueSeen
	queued []queuedCopy // oldest first
}

// queuedCopy is a queued copy's source, what it held, and the mark after
// it (0: none yet).
type queuedCopy struct {
	src  []byte
	sum  uint32
	mark uint64
}

func (c *queueingContext) QueueCopyHtoD(dst uint64, src []byte, s gpu.Stream) error {
	if err := c.Context.CopyHtoD(dst, src, s); err != nil {
		return err
	}
	c.queued = append(c.queued, queuedCopy{src: src, sum: crc32.ChecksumIEEE(src)})
	return nil
}

func (c *queueingContext) Mark(mark uint64) error {
	for i := range c.queued {
		if c.queued[i].mark == 0 {
			c.queued[i].mark = mark
		}
	}
	return nil
}

func (c *queueingContext) Settle(upTo uint64) error {
	c.seen.mu.Lock()
	defer c.seen.mu.Unlock()
	for len(c.queued) > 0 && c.queued[0].mark != 0 && c.queued[0].mark <= upTo {
		q := c.queued[0]
		c.queued = c.queued[1:]
		c.seen.settled++
		if crc32.ChecksumIEEE(q.src) != q.sum {
			c.seen.changed++
		}
	}
	return nil
}

// TestQueuedReplayKeepsBuffers: a standby whose replica queues its copies
// (as a CUDA one does) keeps every receive buffer until the copies that
// read it are settled, through a resync (a standby joining while guests
// copy) and live streaming on the null stream and a guest's stream; the
// replica ends identical.
func TestQueuedReplayKeepsBuffers(t *testing.T) {
	seen := &queueSeen{}
	c, err := cluster.Start(cluster.Options{Replicate: true, Mode: replicate.ModeCommit, MaxLagBytes: 64 << 20,
		NewStandbyBackend: func() (gpu.Backend, error) { return queueingBackend{Backend: sim.New(1 << 30), seen: seen}, nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f := &fixture{Cluster: c, t: t}
	g := f.guest("queued")
	const size = 32 << 20
	buf, err := g.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	st, err := g.CreateStream()
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	data := make([]byte, 256<<10) // frames of this size arrive in lent buffers
	copies := func(n int) {
		for i := range n {
			for j := range data {
				data[j] = byte(rng.Uint32())
			}
			at := buf + pvdriver.DevicePtr(rng.Uint64N(size-uint64(len(data))+1)&^7)
			if i%3 == 2 {
				err = g.CopyHtoDAsync(at, data, st)
			} else {
				err = g.CopyHtoD(at, data)
			}
			if err == nil && i%5 == 4 {
				err = g.Memset32(at, rng.Uint32(), 1024)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	copies(200) // before the standby: its resync snapshot carries them
	f.startStandby()
	copies(200) // while it resyncs, then live
	f.waitProtected()
	copies(200)
	if err := g.Synchronize(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the standby's applier settles once it caught up
	mustMatch(t, f.verify())
	seen.mu.Lock()
	defer seen.mu.Unlock()
	if seen.settled < 200 || seen.changed != 0 {
		t.Fatalf("%d queued copies settled, %d of them with a source that changed first: want hundreds, none changed", seen.settled, seen.changed)
	}
}
