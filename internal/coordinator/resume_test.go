package coordinator

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/failover"
	"github.com/vgpuha/vgpuha/internal/lab/etcdtest"
)

// leader dials through a proxy (which the test cuts; that ends its
// connections, and the client takes up to a second to connect again) and
// leads group g1 under a lease of ttl.
func leader(t *testing.T, ep string, ttl time.Duration) (*Coordinator, *events, *etcdtest.Proxy, uint64) {
	t.Helper()
	proxy := etcdtest.NewProxy(t, ep)
	c, err := Dial(Config{Endpoints: []string{proxy.Addr()}, Group: "g1", ID: "p", TTL: ttl, DialTimeout: 2 * time.Second,
		Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	ev := newEvents()
	c.Start(ev.feed)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	term, err := c.Lead(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return c, ev, proxy, term
}

// TestLeaseRegainedInTime: cut from etcd for less than its lease, a
// leader reports LeaseLost, and once etcd answers proves it still leads
// under the same term; the server may answer again (LeadsUntil).
// The cut heals at LeaseLost, half the lease after the last renewal; the
// client then takes up to a second to connect again (its retry after the
// silent connection the heal closes), so the lease is 6 s: the 4 s it
// was left under a second to renew in, thin on a loaded machine.
func TestLeaseRegainedInTime(t *testing.T) {
	const ttl = 6 * time.Second
	c, ev, proxy, term := leader(t, etcdtest.Start(t), ttl)
	proxy.Partition(true)
	ev.wait(t, failover.LeaseLost, ttl) // due TTL/2 after the last renewal
	if !c.LeadsUntil().IsZero() {
		t.Fatal("a leader that lost its lease may still answer")
	}
	proxy.Partition(false)
	got, _ := ev.wait(t, failover.LeaseRegained, ttl/2) // later, the lease is gone
	if got.Term != term || !c.Leader() || time.Until(c.LeadsUntil()) <= 0 {
		t.Fatalf("regained under term %d (led under %d), leader %v, leads until %v", got.Term, term, c.Leader(), c.LeadsUntil())
	}
}

// TestReleadAfterExpiry: cut from etcd past its lease, a leader learns
// the lease expired; asked to lead again it wins under a higher term,
// nobody having led in between.
func TestReleadAfterExpiry(t *testing.T) {
	c, ev, proxy, term := leader(t, etcdtest.Start(t), time.Second)
	proxy.Partition(true)
	ev.wait(t, failover.LeaseLost, 2*time.Second)
	time.Sleep(1500 * time.Millisecond) // etcd expires the 1 s lease
	proxy.Partition(false)
	ev.wait(t, failover.LeaseExpired, 3*time.Second)
	c.Relead(term)
	got, _ := ev.wait(t, failover.LeaseRegained, 5*time.Second)
	if got.Term <= term || !c.Leader() {
		t.Fatalf("led again under term %d (was %d), leader %v", got.Term, term, c.Leader())
	}
}

// TestReleadDeposed: while a leader's lease was expired another node led
// (and wrote the term record): the old leader's Relead reports Deposed
// under that node's term and does not lead.
func TestReleadDeposed(t *testing.T) {
	ep := etcdtest.Start(t)
	c, ev, proxy, term := leader(t, ep, time.Second)
	proxy.Partition(true)
	ev.wait(t, failover.LeaseLost, 2*time.Second)
	other := dial(t, ep, "s", "", prometheus.NewRegistry())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	newer, err := other.Lead(ctx) // wins once the old lease expired
	if err != nil {
		t.Fatal(err)
	}
	proxy.Partition(false)
	ev.wait(t, failover.LeaseExpired, 3*time.Second)
	c.Relead(term)
	got, _ := ev.wait(t, failover.Deposed, 5*time.Second)
	if got.Term != newer || c.Leader() {
		t.Fatalf("deposed under term %d, want the other's %d; leader %v", got.Term, newer, c.Leader())
	}
}
