package node_test

import (
	"context"
	"encoding/binary"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/failover"
	"github.com/vgpuha/vgpuha/internal/coordinator"
	"github.com/vgpuha/vgpuha/internal/lab/etcdtest"
	"github.com/vgpuha/vgpuha/internal/node"
	"github.com/vgpuha/vgpuha/pvdriver"
)

// stallPair is a coordinated primary P and standby S on a three-member
// etcd cluster of processes, and a guest writing a counter through P.
type stallPair struct {
	etcd  *etcdtest.Processes
	p, s  *node.Node
	guest *loopingGuest
}

func startStallPair(t *testing.T) *stallPair {
	sp := &stallPair{etcd: etcdtest.StartProcesses(t, 3)}
	dir := t.TempDir()
	dial := func(id, advertise string) *coordinator.Coordinator {
		c, err := coordinator.Dial(coordinator.Config{Endpoints: sp.etcd.Endpoints(), Group: "vm1", ID: id, Advertise: advertise,
			TTL: testTTL, DialTimeout: 2 * time.Second, Registry: prometheus.NewRegistry()})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	lnS := listen(t)
	cfgS := config(t, "unix://"+filepath.Join(dir, "s.sock"))
	cfgS.Coordinator = dial("s", lnS.Addr().String())
	var err error
	if sp.s, err = node.StartStandby(cfgS, lnS); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sp.s.Close)
	cfgP := config(t, "unix://"+filepath.Join(dir, "p.sock"))
	cfgP.ReplicateTo = []string{lnS.Addr().String()}
	cfgP.Coordinator = dial("p", "")
	if sp.p, err = node.StartPrimary(cfgP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sp.p.Close)
	waitFor(t, "S recorded in sync", inSyncRecorded(t, sp.etcd.Endpoints()[0], lnS.Addr().String()))
	sp.guest = startGuest(t, cfgP.GuestListen, cfgS.GuestListen)
	return sp
}

// serving is which nodes serve as primary now.
func (sp *stallPair) serving() (p, s bool) {
	rp, _ := sp.p.Role()
	rs, _ := sp.s.Role()
	return rp == failover.Primary && sp.p.Server().IsPrimary(), rs == failover.Primary && sp.s.Server().IsPrimary()
}

// stall freezes every etcd member for d, checking meanwhile and for after
// afterwards that the nodes never serve at once; it returns when exactly
// one serves (or fails after a lease and a half).
func (sp *stallPair) stall(t *testing.T, d, after time.Duration) {
	t.Helper()
	if err := sp.etcd.FreezeAll(); err != nil {
		t.Fatal(err)
	}
	sp.watch(t, d)
	if err := sp.etcd.ThawAll(); err != nil {
		t.Fatal(err)
	}
	thawed := time.Now()
	for {
		p, s := sp.serving()
		if p != s {
			break
		}
		if p && s {
			t.Fatal("both nodes serve")
		}
		if time.Since(thawed) > testTTL+testTTL/2 {
			rp, tp := sp.p.Role()
			rs, ts := sp.s.Role()
			t.Fatalf("%v after etcd thawed nobody serves: P %s term %d, S %s term %d", time.Since(thawed), rp, tp, rs, ts)
		}
		time.Sleep(5 * time.Millisecond)
	}
	sp.watch(t, after)
}

func (sp *stallPair) watch(t *testing.T, d time.Duration) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if p, s := sp.serving(); p && s {
			t.Fatal("both nodes serve")
		}
	}
}

// TestEtcdStallsShorterThanTheLease: every etcd member frozen for 1.2 s
// (the lease is 2 s), three times, under a guest's load: the primary
// suspends at half the lease and resumes once etcd answers, the standby
// never takes over, and the guest's every acknowledged write is there.
// The stall is past half the lease whenever it starts (renewals go every
// third of that half), and leaves the thawed members and the first
// renewal almost half a second before the lease ends: with 1.5 s that
// was under 0.2 s, which a loaded 2-core machine overran (issue 46).
func TestEtcdStallsShorterThanTheLease(t *testing.T) {
	if testing.Short() {
		t.Skip("three etcd stalls of 1.2 s")
	}
	sp := startStallPair(t)
	_, term := sp.p.Role()
	for i := range 3 {
		before := sp.guest.acked.Load()
		sp.stall(t, 1200*time.Millisecond, time.Second)
		if rp, tp := sp.p.Role(); rp != failover.Primary || tp != term {
			t.Fatalf("stall %d: P %s term %d; want primary term %d (the lease was kept)", i, rp, tp, term)
		}
		if rs, _ := sp.s.Role(); rs != failover.Standby {
			t.Fatalf("stall %d: S %s; want standby", i, rs)
		}
		waitFor(t, "the guest writes again", func() bool { return sp.guest.acked.Load() > before })
	}
	sp.guest.stop(t)
	if n := len(sp.guest.c.Failovers()); n > 3 {
		t.Logf("guest resumed %d times (on P again)", n)
	}
}

// TestEtcdStallSequence: a stall longer than the lease but shorter than
// the primary's ride-out (lease expired: it leads again under a new
// term, nobody took over), then one longer than that (the primary gives
// up, the standby takes over), then a short one on the new primary (no
// standby covers it: it rides it out). Exactly one node serves a lease
// after each, and no acknowledged write is lost.
func TestEtcdStallSequence(t *testing.T) {
	if testing.Short() {
		t.Skip("etcd stalls of several seconds")
	}
	sp := startStallPair(t)
	_, term := sp.p.Role()
	sp.stall(t, testTTL+500*time.Millisecond, time.Second)
	rp, tp := sp.p.Role()
	if rs, _ := sp.s.Role(); rp != failover.Primary || tp <= term || rs != failover.Standby {
		t.Fatalf("after a %v stall: P %s term %d (was %d), S %s; want P leading again under a higher term", testTTL+500*time.Millisecond, rp, tp, term, rs)
	}
	sp.stall(t, 3*testTTL, time.Second)
	rs, ts := sp.s.Role()
	if rs != failover.Primary || ts <= tp {
		t.Fatalf("after a %v stall: S %s term %d; want the standby promoted above %d", 3*testTTL, rs, ts, tp)
	}
	sp.stall(t, 1500*time.Millisecond, time.Second)
	if rs2, ts2 := sp.s.Role(); rs2 != failover.Primary || ts2 != ts {
		t.Fatalf("after a short stall: S %s term %d; want primary term %d", rs2, ts2, ts)
	}
	sp.guest.stop(t)
}

// loopingGuest writes an increasing counter to one allocation and reads it
// back; acked is the last value the node acknowledged.
type loopingGuest struct {
	c     *pvdriver.Client
	ptr   pvdriver.DevicePtr
	acked atomic.Uint64
	done  chan struct{}
	wg    sync.WaitGroup
	err   atomic.Value
}

func startGuest(t *testing.T, ep string, failover ...string) *loopingGuest {
	c, err := pvdriver.Open(context.Background(), ep, pvdriver.Options{GuestName: "vm", Failover: failover})
	if err != nil {
		t.Fatal(err)
	}
	g := &loopingGuest{c: c, done: make(chan struct{})}
	if g.ptr, err = c.Alloc(8); err != nil {
		t.Fatal(err)
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		buf := make([]byte, 8)
		for i := uint64(1); ; i++ {
			select {
			case <-g.done:
				return
			default:
			}
			binary.LittleEndian.PutUint64(buf, i)
			if err := c.CopyHtoD(g.ptr, buf); err != nil {
				g.err.Store(err)
				return
			}
			g.acked.Store(i)
			time.Sleep(time.Millisecond)
		}
	}()
	return g
}

// stop ends the loop and checks that the node holds the last acknowledged
// value.
func (g *loopingGuest) stop(t *testing.T) {
	t.Helper()
	close(g.done)
	g.wg.Wait()
	if err, _ := g.err.Load().(error); err != nil {
		t.Fatalf("guest: %v", err)
	}
	buf := make([]byte, 8)
	if err := g.c.CopyDtoH(buf, g.ptr); err != nil {
		t.Fatal(err)
	}
	if got, want := binary.LittleEndian.Uint64(buf), g.acked.Load(); got != want {
		t.Fatalf("the node holds %d, the guest's last acknowledged write was %d", got, want)
	}
	g.c.Close()
}
