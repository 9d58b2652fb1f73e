package coordinator

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vgpuha/vgpuha/failover"
	"github.com/vgpuha/vgpuha/internal/lab/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// events records what a coordinator fed, with the time.
type events struct {
	mu  sync.Mutex
	got []failover.Event
	at  []time.Time
	ch  chan failover.Event
}

func newEvents() *events { return &events{ch: make(chan failover.Event, 16)} }

func (e *events) feed(ev failover.Event) {
	e.mu.Lock()
	e.got, e.at = append(e.got, ev), append(e.at, time.Now())
	e.mu.Unlock()
	e.ch <- ev
}

func (e *events) wait(t *testing.T, kind failover.EventKind, within time.Duration) (failover.Event, time.Time) {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case ev := <-e.ch:
			if ev.Kind == kind {
				e.mu.Lock()
				defer e.mu.Unlock()
				return ev, e.at[len(e.at)-1]
			}
		case <-deadline:
			t.Fatalf("no event %d within %v", kind, within)
		}
	}
}

func dial(t *testing.T, ep, id, advertise string, reg prometheus.Registerer) *Coordinator {
	t.Helper()
	c, err := Dial(Config{Endpoints: []string{ep}, Group: "g1", ID: id, Advertise: advertise, TTL: time.Second,
		DialTimeout: 2 * time.Second, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// TestLeaseLostBeforeExpiry: a leader cut off from etcd reports LeaseLost
// before etcd can expire its lease; the margin is measured against the
// moment etcd really deleted the leader key.
func TestLeaseLostBeforeExpiry(t *testing.T) {
	ep := etcdtest.Start(t)
	proxy := etcdtest.NewProxy(t, ep)
	reg := prometheus.NewRegistry()
	c := dial(t, proxy.Addr(), "p", "", reg)
	ev := newEvents()
	c.Start(ev.feed)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.Lead(ctx); err != nil {
		t.Fatal(err)
	}
	watcher, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}})
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Close()
	wch := watcher.Watch(ctx, "/vgpuha/groups/g1/leader", clientv3.WithPrefix())
	time.Sleep(300 * time.Millisecond) // some renewals
	proxy.Partition(true)
	_, lostAt := ev.wait(t, failover.LeaseLost, 2*time.Second)
	lastOK := c.LastRenewal()
	var deletedAt time.Time
	for deletedAt.IsZero() {
		select {
		case resp := <-wch:
			for _, e := range resp.Events {
				if e.Type == clientv3.EventTypeDelete {
					deletedAt = time.Now()
				}
			}
		case <-ctx.Done():
			t.Fatal("the leader key never expired")
		}
	}
	margin := deletedAt.Sub(lostAt)
	t.Logf("lease TTL 1 s: LeaseLost %v after the last renewal was sent; etcd expired the key %v later (margin)",
		lostAt.Sub(lastOK).Round(time.Millisecond), margin.Round(time.Millisecond))
	if margin < 400*time.Millisecond {
		t.Fatalf("stopped only %v before the lease expired; want at least ~TTL/2", margin)
	}
	if n := testutil.ToFloat64(c.metrics.leasesLost); n != 1 {
		t.Errorf("lease losses counted %v, want 1", n)
	}
	if probs, err := testutil.CollectAndLint(c.metrics.elections); err != nil || len(probs) > 0 {
		t.Errorf("metrics lint: %v %v", probs, err)
	}
}

// TestOnlyTheInSyncStandbyWins: a standby the group's record does not
// name in sync is refused; the named one waits while the leader holds the
// key and wins, under a higher term, once the leader lets go.
func TestOnlyTheInSyncStandbyWins(t *testing.T) {
	ep := etcdtest.Start(t)
	p := dial(t, ep, "p", "", prometheus.NewRegistry())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pterm, err := p.Lead(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s := dial(t, ep, "s", "10.0.0.2:7071", prometheus.NewRegistry())
	sev := newEvents()
	s.Start(sev.feed)
	s.Campaign()
	if ev, _ := sev.wait(t, failover.CampaignEnded, 2*time.Second); ev.Kind != failover.CampaignEnded {
		t.Fatal("campaign without a record was not refused")
	}
	// Two standbys recorded, one in sync: the other is refused.
	rec := StandbyRecord{Standbys: []RecordedStandby{{Addr: "10.0.0.3:7071"}, {Addr: "10.0.0.2:7071", InSync: true}}, MinInSync: 2, Term: pterm}
	if err := p.SetStandby(ctx, rec); err != nil {
		t.Fatal(err)
	}
	behind := dial(t, ep, "behind", "10.0.0.3:7071", prometheus.NewRegistry())
	bev := newEvents()
	behind.Start(bev.feed)
	behind.Campaign()
	if ev, _ := bev.wait(t, failover.CampaignEnded, 2*time.Second); ev.Kind != failover.CampaignEnded {
		t.Fatal("a standby recorded, but not in sync, was not refused")
	}
	s.Campaign()
	select {
	case ev := <-sev.ch:
		t.Fatalf("standby got %v while the leader holds the key", ev)
	case <-time.After(300 * time.Millisecond):
	}
	p.Resign()
	won, _ := sev.wait(t, failover.ElectionWon, 3*time.Second)
	if won.Term <= pterm {
		t.Fatalf("won under term %d, not above the old leader's %d", won.Term, pterm)
	}
	if err := p.SetStandby(ctx, StandbyRecord{Standbys: []RecordedStandby{{Addr: "x"}}}); err == nil {
		t.Fatal("a deposed leader rewrote the standby record")
	}
}

// TestPickStandby: the leader takes a free, registered standby from the
// pool; attached ones and avoided ones are skipped.
func TestPickStandby(t *testing.T) {
	ep := etcdtest.Start(t)
	p := dial(t, ep, "p", "", prometheus.NewRegistry())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	term, err := p.Lead(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []Member{{ID: "a", Role: "standby", Addr: "a:1", Attached: true}, {ID: "b", Role: "standby", Addr: "b:1"}, {ID: "c", Role: "standby", Addr: "c:1"}} {
		s := dial(t, ep, m.ID, m.Addr, prometheus.NewRegistry())
		if err := s.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	got, err := p.PickStandby(ctx, "b:1")
	if err != nil || got != "c:1" {
		t.Fatalf("picked %q, %v; want c:1", got, err)
	}
	groups, err := Groups(ctx, p.Client())
	if err != nil || len(groups) != 1 {
		t.Fatalf("groups %v, %v", groups, err)
	}
	g := groups[0]
	if g.LeaderID != "p" || g.LeaderTerm != term || len(g.Members) != 3 {
		t.Fatalf("group status %+v", g)
	}
	if _, err := ParseURL("etcd://h1:2379,h2:2379"); err != nil {
		t.Error(err)
	}
	if _, err := ParseURL("http://h1:2379"); err == nil || !strings.Contains(err.Error(), "etcd://") {
		t.Errorf("ParseURL(http://...) = %v", err)
	}
}
