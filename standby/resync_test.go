package standby_test

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/internal/lab/cluster"
	"github.com/vgpuha/vgpuha/kernels"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
	"github.com/vgpuha/vgpuha/replicate/link"
)

// scribbler makes random guest writes of every kind a guest can cause:
// copies (sync and on a stream), memsets (8 and 32 bit), device-to-device
// copies, pointer_chase launches (a kernel following pointers stored in
// device memory, writing its result), and frees followed by allocations.
type scribbler struct {
	t      *testing.T
	rng    *rand.Rand
	guests []*scribbleGuest
	ops    atomic.Int64
}

type scribbleGuest struct {
	g      *pvdriver.Client
	bufs   []pvdriver.DevicePtr
	sizes  []uint64
	chase  pvdriver.Function
	stream pvdriver.Stream
}

func newScribbler(t *testing.T, c *fixture, seed uint64, guests, bufs int) *scribbler {
	s := &scribbler{t: t, rng: rand.New(rand.NewPCG(seed, 19))}
	img, err := kernels.Image("pointer_chase")
	if err != nil {
		t.Fatal(err)
	}
	for range guests {
		sg := &scribbleGuest{g: c.guest("scribbler")}
		m, err := sg.g.LoadModule(img)
		if err == nil {
			sg.chase, err = sg.g.GetFunction(m, "pointer_chase")
		}
		if err == nil {
			sg.stream, err = sg.g.CreateStream()
		}
		if err != nil {
			t.Fatal(err)
		}
		for range bufs {
			s.alloc(sg)
		}
		s.guests = append(s.guests, sg)
	}
	return s
}

// alloc adds a buffer of random size and contents (up to 1.5 MiB, so a
// buffer spans several snapshot records).
func (s *scribbler) alloc(sg *scribbleGuest) {
	n := 4096 + s.rng.Uint64N(3<<19)
	p, err := sg.g.Alloc(n)
	if err != nil {
		s.t.Fatal(err)
	}
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(s.rng.Uint32())
	}
	if err := sg.g.CopyHtoD(p, data); err != nil {
		s.t.Fatal(err)
	}
	sg.bufs, sg.sizes = append(sg.bufs, p), append(sg.sizes, n)
}

// step makes one random write.
func (s *scribbler) step() {
	sg := s.guests[s.rng.IntN(len(s.guests))]
	i := s.rng.IntN(len(sg.bufs))
	n := 1 + s.rng.Uint64N(sg.sizes[i]/2)
	at := sg.bufs[i] + pvdriver.DevicePtr(s.rng.Uint64N(sg.sizes[i]-n+1))
	var err error
	switch s.rng.IntN(8) {
	case 0:
		err = sg.g.CopyHtoD(at, randomBytes(s.rng, int(n)))
	case 1:
		err = sg.g.CopyHtoDAsync(at, randomBytes(s.rng, int(n)), sg.stream)
	case 2:
		err = sg.g.Memset8(at, byte(s.rng.Uint32()), n)
	case 3:
		err = sg.g.Memset32Async(at&^3, s.rng.Uint32(), n/4, sg.stream)
	case 4:
		j := s.rng.IntN(len(sg.bufs))
		if m := min(n, sg.sizes[j]); m > 0 {
			err = sg.g.CopyDtoD(at, sg.bufs[j]+pvdriver.DevicePtr(s.rng.Uint64N(sg.sizes[j]-m+1)), m)
		}
	case 5:
		err = s.chase(sg)
	case 7: // a copy whose source then changes: exact only if the copy read the old source
		j := s.rng.IntN(len(sg.bufs))
		m := min(n, sg.sizes[j])
		src := sg.bufs[j] + pvdriver.DevicePtr(s.rng.Uint64N(sg.sizes[j]-m+1))
		if err = sg.g.CopyDtoD(at, src, m); err == nil {
			err = sg.g.Memset8(src, byte(s.rng.Uint32()), m)
		}
	case 6:
		if err = sg.g.Free(sg.bufs[i]); err == nil {
			sg.bufs = append(sg.bufs[:i], sg.bufs[i+1:]...)
			sg.sizes = append(sg.sizes[:i], sg.sizes[i+1:]...)
			s.alloc(sg)
		}
	}
	if err != nil {
		s.t.Errorf("guest write: %v", err)
	}
	s.ops.Add(1)
}

// chase stores a ring of three nodes {next, value} across the guest's
// buffers and has pointer_chase walk it, writing the sum and the last
// pointer into a random place.
func (s *scribbler) chase(sg *scribbleGuest) error {
	var at [3]pvdriver.DevicePtr
	for k := range at {
		j := s.rng.IntN(len(sg.bufs))
		at[k] = sg.bufs[j] + pvdriver.DevicePtr(16*s.rng.Uint64N(sg.sizes[j]/16))
	}
	for k := range at {
		node := binary.LittleEndian.AppendUint64(nil, uint64(at[(k+1)%3]))
		if err := sg.g.CopyHtoD(at[k], binary.LittleEndian.AppendUint64(node, s.rng.Uint64())); err != nil {
			return err
		}
	}
	j := s.rng.IntN(len(sg.bufs))
	out := sg.bufs[j] + pvdriver.DevicePtr(16*s.rng.Uint64N(sg.sizes[j]/16))
	one := abi.Dim3{X: 1, Y: 1, Z: 1}
	return sg.g.Launch(sg.chase, pvdriver.LaunchConfig{Grid: one, Block: one},
		abi.Arg{Kind: abi.ArgPtr, Bits: uint64(at[0])}, abi.Arg{Kind: abi.ArgU32, Bits: uint64(1 + s.rng.IntN(7))}, abi.Arg{Kind: abi.ArgPtr, Bits: uint64(out)})
}

func randomBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// resyncHook returns a fault hook that, while a resync's snapshot streams,
// calls onRecord before each snapshot record the primary sends (the
// sender waits for it): guest writes land between resync steps.
func resyncHook(sender func() *replicate.Sender, onRecord func(n int) bool) link.FaultHook {
	var mu sync.Mutex
	n := 0
	return func(m link.Message) bool {
		s := sender()
		if m.From != link.FromPrimary || m.Type != "record" || s == nil || !s.Status().Resync.Active {
			return true
		}
		mu.Lock()
		defer mu.Unlock()
		n++
		return onRecord(n)
	}
}

// startScribbled starts a primary with guests holding data and no standby,
// with hook on its link.
func startScribbled(t *testing.T, seed uint64, opts cluster.Options, onRecord func(c *fixture, s *scribbler, n int) bool) (*fixture, *scribbler) {
	var c *fixture
	var s *scribbler
	var ready atomic.Bool
	opts.Replicate, opts.Mode = true, replicate.ModeCommit
	if opts.MaxLagBytes == 0 {
		opts.MaxLagBytes = 8 << 20
	}
	opts.Faults = resyncHook(func() *replicate.Sender {
		if !ready.Load() {
			return nil
		}
		return c.Sender
	}, func(n int) bool { return onRecord(c, s, n) })
	cl, err := cluster.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	c = &fixture{Cluster: cl, t: t}
	s = newScribbler(t, c, seed, 2, 4)
	ready.Store(true)
	return c, s
}

// TestResyncInterleavedWrites: guests write in every way between the
// steps of a resync (before each snapshot record), and the replica is
// identical at the next log position; the last seed with a guest share
// set (their writes then wait for the stream to earn them room).
func TestResyncInterleavedWrites(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		opts := cluster.Options{}
		if seed == 4 {
			opts.ResyncGuestShare = 0.1
		}
		c, s := startScribbled(t, seed, opts, func(_ *fixture, s *scribbler, _ int) bool {
			for range 1 + s.rng.IntN(3) {
				s.step()
			}
			return true
		})
		c.startStandby()
		mustMatch(t, c.verify())
		st := c.Sender.Status()
		if s.ops.Load() < 10 || st.Resyncs != 1 || st.ResyncRestarts != 0 {
			t.Fatalf("seed %d: %d writes during the resync, %d resyncs, %d restarts", seed, s.ops.Load(), st.Resyncs, st.ResyncRestarts)
		}
		if rs := c.StandbyStatus().Replication; !rs.InSync || rs.Resync.BytesTotal == 0 || rs.Resync.BytesDone < rs.Resync.BytesTotal {
			t.Errorf("seed %d: standby's resync status at the end: %+v", seed, rs)
		}
		c.Close()
	}
}

// TestResyncInterrupted: a standby killed, or a link cut, in the middle of
// a resync's snapshot is resynced again from a new snapshot and ends
// identical.
func TestResyncInterrupted(t *testing.T) {
	for _, kill := range []bool{false, true} {
		stop, stopped := make(chan struct{}), make(chan struct{})
		var once sync.Once
		c, s := startScribbled(t, 5, cluster.Options{}, func(c *fixture, s *scribbler, n int) bool {
			s.step()
			if n == 6 {
				once.Do(func() {
					close(stop)
					select { // the standby goes meanwhile
					case <-stopped:
					case <-time.After(5 * time.Second):
					}
				})
			}
			return true
		})
		c.startStandby()
		<-stop
		if kill {
			c.StopStandby()
			close(stopped)
			c.startStandby()
		} else {
			c.Standby.Agent().Receiver.Close()
			close(stopped)
		}
		mustMatch(t, c.verify())
		if st := c.Sender.Status(); st.Resyncs < 2 {
			t.Errorf("kill %v: %d resyncs, want a second one after the interruption", kill, st.Resyncs)
		}
		if s.ops.Load() == 0 {
			t.Error("no writes during the resync")
		}
		c.Close()
	}
}

// TestResyncBudgetRestarts: a single guest write larger than the whole
// resync budget, made while a snapshot streams, makes the resync start
// over, and it then completes.
func TestResyncBudgetRestarts(t *testing.T) {
	big := make([]byte, 2<<20)
	c, _ := startScribbled(t, 9, cluster.Options{MaxLagBytes: 1 << 20, ResyncBudgetBytes: 1 << 20}, func(c *fixture, s *scribbler, n int) bool {
		if c.Sender.Status().Resyncs == 1 && n == 3 {
			g := s.guests[0].g
			p, err := g.Alloc(uint64(len(big)))
			if err == nil {
				err = g.CopyHtoD(p, big)
			}
			if err != nil {
				s.t.Error(err)
			}
		}
		return true
	})
	c.startStandby()
	mustMatch(t, c.verify())
	if st := c.Sender.Status(); st.ResyncRestarts == 0 || st.Resyncs < 2 {
		t.Errorf("resyncs %d, restarts %d: want a restart past the budget", st.Resyncs, st.ResyncRestarts)
	}
}

// TestResyncSlowsWritersInsteadOfRestarting: guests that keep writing
// faster than a resync streams (many times its budget over the resync)
// are slowed while the snapshot streams, not frozen, and the resync ends
// the first time. (It used to start over each time the log outgrew the
// budget: with a steady writer, for ever; the 4 GiB row of bench resync
// on a GPU never ended.)
func TestResyncSlowsWritersInsteadOfRestarting(t *testing.T) {
	for _, share := range []float64{0, 0.1} {
		t.Run(fmt.Sprintf("guest share %v", share), func(t *testing.T) { slowsWritersInsteadOfRestarting(t, share) })
	}
}

func slowsWritersInsteadOfRestarting(t *testing.T, share float64) {
	const budget, write = 2 << 20, 128 << 10
	c, s := startScribbled(t, 13, cluster.Options{MaxLagBytes: 1 << 20, ResyncBudgetBytes: budget, ResyncRate: 4 << 20, ResyncGuestShare: share},
		func(*fixture, *scribbler, int) bool { return true })
	sg := s.guests[0]
	var writes atomic.Int64
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		data := make([]byte, write)
		for i := 0; ; i++ {
			select {
			case <-quit:
				return
			default:
			}
			j := i % len(sg.bufs)
			if err := sg.g.CopyHtoD(sg.bufs[j], data[:min(write, sg.sizes[j])]); err != nil {
				t.Error(err)
				return
			}
			writes.Add(1)
		}
	}()
	time.Sleep(50 * time.Millisecond)
	before := writes.Load()
	c.startStandby()
	err := c.WaitProtected(20 * time.Second)
	during := writes.Load() - before
	close(quit)
	<-done
	if err != nil {
		t.Fatalf("%v (resync status %+v)", err, c.Sender.Status())
	}
	mustMatch(t, c.verify())
	st := c.Sender.Status()
	if st.ResyncRestarts != 0 || st.Resyncs != 1 {
		t.Errorf("resyncs %d, restarts %d: want one resync, no restart", st.Resyncs, st.ResyncRestarts)
	}
	if during*write < budget {
		t.Errorf("guests wrote %d bytes while the standby resynced: frozen, not slowed", during*write)
	}
}

// TestPrimaryDiesMidResync: a standby whose primary dies in the middle of
// a resync holds half a replica: it is not in sync and never takes over.
func TestPrimaryDiesMidResync(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: waits several detection timeouts")
	}
	var cut atomic.Bool
	midway := make(chan struct{})
	c, _ := startScribbled(t, 11, cluster.Options{Failover: true}, func(c *fixture, s *scribbler, n int) bool {
		if n == 5 {
			cut.Store(true)
			close(midway)
		}
		return !cut.Load()
	})
	c.startStandby()
	<-midway
	if st := c.StandbyStatus().Replication; st.InSync {
		t.Fatalf("in sync in the middle of a resync: %+v", st)
	}
	c.KillPrimary()
	time.Sleep(time.Second) // several detection timeouts
	if p := c.Standby.Promoted(); p != nil {
		t.Fatalf("a half-resynced standby took over: %+v", p)
	}
	if st := c.StandbyStatus(); st.Replication.InSync || st.Role != "standby" {
		t.Fatalf("after the primary died mid-resync: role %s, in sync %v", st.Role, st.Replication.InSync)
	}
}
