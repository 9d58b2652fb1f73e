package hypervisor_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/pvdriver"
)

// TestLeaseDeadlinePerRequest: a node whose lease deadline has passed
// answers nothing, although nobody fenced it (its fence is still on its
// way, or the process was frozen past its lease): the next request runs
// not and gets no reply, and no new session opens.
func TestLeaseDeadlinePerRequest(t *testing.T) {
	e := start(t, hypervisor.DefaultConfig())
	var deadline atomic.Int64
	deadline.Store(time.Now().Add(time.Hour).UnixNano())
	e.srv.SetRole(hypervisor.Role{Term: 1, Lease: func() time.Time { return time.Unix(0, deadline.Load()) }, Unprotected: func() (bool, bool) { return true, false }})
	g := e.client(t, "g")
	if _, err := g.Alloc(4096); err != nil {
		t.Fatalf("within the lease: %v", err)
	}
	ran := func() float64 {
		return counter(t, e, "vgpuha_guest_requests_total", map[string]string{"op": "alloc", "status": "ok"})
	}
	before := ran()
	deadline.Store(time.Now().Add(-time.Millisecond).UnixNano())
	if _, err := g.Alloc(4096); err == nil {
		t.Fatal("a request after the lease deadline was answered")
	}
	if after := ran(); after != before {
		t.Fatalf("a request after the lease deadline ran: %v allocations, %v before", after, before)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if c, err := pvdriver.Open(ctx, e.endpoint, pvdriver.Options{GuestName: "late"}); err == nil {
		c.Close()
		t.Fatal("a session opened after the lease deadline")
	}
	if !e.srv.IsPrimary() {
		t.Fatal("the test meant to check the deadline, not a fence")
	}
	deadline.Store(time.Now().Add(time.Hour).UnixNano()) // renewed: serving again
	if _, err := e.client(t, "renewed").Alloc(4096); err != nil {
		t.Fatalf("after a renewal: %v", err)
	}
}
