package node_test

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/failover"
	"github.com/vgpuha/vgpuha/internal/coordinator"
	"github.com/vgpuha/vgpuha/internal/lab/etcdtest"
	"github.com/vgpuha/vgpuha/internal/node"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/replicate/link"
)

// trioTTL is the trio's lease: three nodes and etcd in one race-enabled
// process on two loaded cores starve a 2 s lease's renewals (measured: a
// winner fenced by its own lease right after it won). A takeover does not
// wait for it: a closed primary revokes its lease.
const trioTTL = 5 * time.Second

// trio is a coordinated primary with two standbys, k = 2.
type trio struct {
	etcd, dir string
	p         *node.Node
	cfgP      node.Config
	s         [2]*node.Node
	cfgS      [2]node.Config
	addr      [2]string
	regS      [2]*prometheus.Registry // the standbys' coordinator metrics
}

// startStandby starts standby i on addr (a fresh node: an empty replica).
func (tr *trio) startStandby(t *testing.T, i int, ln net.Listener) {
	t.Helper()
	name := []string{"s1", "s2"}[i]
	tr.regS[i] = prometheus.NewRegistry()
	cfg := config(t, "unix://"+filepath.Join(tr.dir, name+".sock"))
	cfg.MinInSync = 2
	cfg.Coordinator = coordTTL(t, tr.etcd, name, tr.addr[i], tr.regS[i], trioTTL)
	n, err := node.StartStandby(cfg, ln)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	tr.s[i], tr.cfgS[i] = n, cfg
}

func startTrio(t *testing.T, primary func(*node.Config)) *trio {
	tr := &trio{etcd: etcdtest.Start(t), dir: t.TempDir()}
	for i := range tr.s {
		ln := listen(t)
		tr.addr[i] = ln.Addr().String()
		tr.startStandby(t, i, ln)
	}
	tr.cfgP = config(t, "unix://"+filepath.Join(tr.dir, "p.sock"))
	tr.cfgP.ReplicateTo, tr.cfgP.MinInSync = tr.addr[:], 2
	tr.cfgP.Coordinator = coordTTL(t, tr.etcd, "p", "", prometheus.NewRegistry(), trioTTL)
	if primary != nil {
		primary(&tr.cfgP)
	}
	p, err := node.StartPrimary(tr.cfgP)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	tr.p = p
	return tr
}

// guest opens a guest on the primary that fails over to either standby.
func (tr *trio) guest(t *testing.T) *pvdriver.Client {
	g, err := pvdriver.Open(context.Background(), tr.cfgP.GuestListen, pvdriver.Options{GuestName: "vm",
		Failover: []string{tr.cfgS[1].GuestListen, tr.cfgS[0].GuestListen}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// recorded reports whether the group's record, written under a term at
// least term, names exactly inSync in sync.
func recorded(t *testing.T, etcd string, term uint64, inSync ...string) func() bool {
	c := coord(t, etcd, "reader", "", prometheus.NewRegistry())
	t.Cleanup(c.Close)
	return func() bool {
		gs, err := coordinator.Groups(context.Background(), c.Client())
		if err != nil || len(gs) != 1 || gs[0].Standby.Term < term {
			return false
		}
		got := gs[0].Standby.InSyncAddrs()
		if len(got) != len(inSync) {
			return false
		}
		for _, a := range inSync {
			if !gs[0].Standby.InSync(a) {
				return false
			}
		}
		return true
	}
}

// campaigns counts a node's elections of every outcome (refused ones
// included) from its coordinator's metrics.
func campaigns(t *testing.T, reg *prometheus.Registry) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() == "vgpuha_coordinator_elections_total" {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// TestCommitWaitsForKStandbys: with two standbys and k = 2, a reply that
// carries something out waits until both hold what it follows: the
// first standby holding it is not enough.
func TestCommitWaitsForKStandbys(t *testing.T) {
	var hold atomic.Bool
	var s2 string
	tr := startTrio(t, func(cfg *node.Config) {
		s2 = cfg.ReplicateTo[1]
		cfg.Faults = func(m link.Message) bool {
			for hold.Load() && m.Peer == s2 && m.Type == "record" {
				time.Sleep(time.Millisecond) // records to s2 are late
			}
			return true
		}
	})
	t.Cleanup(func() { hold.Store(false) }) // before the primary closes
	g := tr.guest(t)
	ptr, err := g.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both standbys recorded in sync", recorded(t, tr.etcd, 0, tr.addr[0], tr.addr[1]))
	hold.Store(true)
	last := tr.p.Log().Last() // the memset comes after
	done := make(chan error, 1)
	go func() {
		err := g.Memset8(ptr, 0x7e, 4096)
		if err == nil {
			err = g.Synchronize()
		}
		done <- err
	}()
	waitFor(t, "the first standby holds the memset", func() bool { return tr.s[0].Agent().Receiver.Status().Received > last })
	select {
	case err := <-done:
		t.Fatalf("the reply went out (%v) while only one of two standbys held it (k = 2)", err)
	case <-time.After(500 * time.Millisecond):
	}
	hold.Store(false)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the reply did not go out once both standbys held it")
	}
	if st := tr.p.Status().Replication; st.InSyncStandbys != 2 || st.MinInSync != 2 || len(st.Standbys) != 2 || st.State != "protected" {
		t.Fatalf("status: %+v", st)
	}
}

// TestFailoverToTheInSyncStandby: with k = 2, one standby restarts and
// is resyncing (slowly) when the primary dies. Replies went on with the
// other standby once etcd recorded the loss; the in-sync standby wins,
// the resyncing one never campaigns, no acknowledged write is lost, and
// the resyncing standby then follows the new primary until it is in sync
// and recorded so under the new term.
func TestFailoverToTheInSyncStandby(t *testing.T) {
	const size = 4 << 20
	tr := startTrio(t, func(cfg *node.Config) { cfg.ResyncRate = 1 << 20 }) // a resync of 4 MiB takes 4 s
	g := tr.guest(t)
	ptr, err := g.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both standbys recorded in sync", recorded(t, tr.etcd, 0, tr.addr[0], tr.addr[1]))
	if err := g.Memset8(ptr, 0x11, size); err != nil || g.Synchronize() != nil {
		t.Fatalf("memset: %v", err)
	}

	tr.s[1].Close() // s2 restarts with an empty replica
	ln, err := net.Listen("tcp", tr.addr[1])
	if err != nil {
		t.Fatal(err)
	}
	tr.startStandby(t, 1, ln)
	waitFor(t, "s2 resyncing", func() bool { return tr.s[1].Agent().Receiver.Status().Resyncing })
	// k = 2 with one standby: replies go on once etcd records s2 out of sync.
	start := time.Now()
	if err := g.Memset8(ptr+size/2, 0x22, size/2); err != nil || g.Synchronize() != nil {
		t.Fatalf("memset with one standby in sync: %v", err)
	}
	t.Logf("a reply with one of k = 2 standbys in sync went out after %v", time.Since(start).Round(time.Millisecond))
	if !recorded(t, tr.etcd, 0, tr.addr[0])() || !tr.s[1].Agent().Receiver.Status().Resyncing {
		t.Fatal("the reply went out before the record named only s1 in sync, or s2 finished resyncing")
	}

	tr.p.Log().Close() // a crash: nothing more reaches the standbys
	tr.p.Close()
	waitFor(t, "s1 promoted", func() bool { r, _ := tr.s[0].Role(); return r == failover.Primary })
	// s2 was out of sync from before the primary died until s1 won (only
	// s1 can resync it, once it leads): it must not have campaigned.
	if n := campaigns(t, tr.regS[1]); n != 0 {
		t.Fatalf("s2 campaigned %v times while it was not in sync", n)
	}
	_, term := tr.s[0].Role()
	out := make([]byte, size)
	if err := g.CopyDtoH(out, ptr); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out[:size/2], bytes.Repeat([]byte{0x11}, size/2)) || !bytes.Equal(out[size/2:], bytes.Repeat([]byte{0x22}, size/2)) {
		t.Fatal("an acknowledged write is missing on the new primary")
	}
	waitFor(t, "s2 in sync with s1, on record under s1's term", recorded(t, tr.etcd, term, tr.addr[1]))
	if r, _ := tr.s[1].Role(); r != failover.Standby {
		t.Fatalf("s2 is %v", r)
	}
	st := tr.s[0].Status().Replication
	if len(st.Standbys) != 1 || st.Standbys[0].Peer != tr.addr[1] || !st.Standbys[0].InSync {
		t.Fatalf("the new primary's standbys: %+v", st.Standbys)
	}
}

// TestTwoInSyncStandbysOneWins: both standbys in sync when the primary
// dies: exactly one wins, the other follows it (resynced from it), and the
// data the guest was told about is on the winner.
func TestTwoInSyncStandbysOneWins(t *testing.T) {
	tr := startTrio(t, nil)
	g := tr.guest(t)
	ptr, err := g.Alloc(1 << 16)
	if err == nil {
		err = g.Memset8(ptr, 0x33, 1<<16)
	}
	if err != nil || g.Synchronize() != nil {
		t.Fatalf("guest: %v", err)
	}
	waitFor(t, "both standbys recorded in sync", recorded(t, tr.etcd, 0, tr.addr[0], tr.addr[1]))
	tr.p.Log().Close()
	tr.p.Close()
	var win, follow int
	waitFor(t, "a standby promoted", func() bool {
		for i, s := range tr.s {
			if r, _ := s.Role(); r == failover.Primary {
				win, follow = i, 1-i
				return true
			}
		}
		return false
	})
	_, term := tr.s[win].Role()
	out := make([]byte, 1<<16)
	if err := g.CopyDtoH(out, ptr); err != nil || !bytes.Equal(out, bytes.Repeat([]byte{0x33}, 1<<16)) {
		t.Fatalf("the guest on the winner: %v", err)
	}
	waitFor(t, "the other standby in sync with the winner, on record", recorded(t, tr.etcd, term, tr.addr[follow]))
	if r, _ := tr.s[follow].Role(); r != failover.Standby {
		t.Fatalf("the other standby is %v", r)
	}
	t.Logf("s%d won under term %d; s%d follows it", win+1, term, follow+1)
}
