package pvdriver_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/internal/lab/cluster"
	"github.com/vgpuha/vgpuha/internal/lab/faultnet"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
	"github.com/vgpuha/vgpuha/replicate/link"
)

// guestViaProxy starts a protected pair whose standby takes over, and a
// guest that reaches the primary through a proxy (which can cut or freeze
// what it carries) and fails over to the standby.
func guestViaProxy(t *testing.T, opts cluster.Options) (*cluster.Cluster, *faultnet.Proxy, *pvdriver.Client) {
	t.Helper()
	opts.Replicate, opts.Mode, opts.StartStandby, opts.Failover = true, replicate.ModeCommit, true, true
	c, err := cluster.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if err := c.WaitProtected(time.Minute); err != nil {
		t.Fatal(err)
	}
	proxyEP := "unix://" + filepath.Join(t.TempDir(), "proxy.sock")
	px, err := faultnet.Listen(proxyEP, c.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	g, err := pvdriver.Open(ctx, proxyEP, pvdriver.Options{GuestName: "g", Failover: []string{c.StandbyEndpoint}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return c, px, g
}

// TestFrozenPrimaryCostsWhatAKilledOneDoes: the primary dies; its guest
// either learns it at once (kill: the connection ends) or sees a connection
// that stays open and silent (freeze: the proxy keeps it open and carries
// nothing, as a SIGSTOPped node's does). Either way the guest's next call
// must complete on the promoted standby, exactly once, and the guest must
// have been looking for the new primary before it began to serve, so that
// it resumed on that node's first answer (Looks > 1), not after waiting
// out a call timeout (a guest that starts looking late finds the node
// already serving on its first look).
func TestFrozenPrimaryCostsWhatAKilledOneDoes(t *testing.T) {
	for _, fault := range []string{"kill", "freeze"} {
		t.Run(fault, func(t *testing.T) {
			c, px, g := guestViaProxy(t, cluster.Options{})
			p, err := g.Alloc(4096)
			if err != nil {
				t.Fatal(err)
			}
			if err := g.Memset8(p, 7, 4096); err != nil {
				t.Fatal(err)
			}
			if fault == "freeze" {
				px.Freeze()
			}
			struck := time.Now()
			c.KillPrimary()
			// Two calls: a memset that must apply once, and a read that
			// sees it. The first waits on the dead (or frozen) primary.
			if err := g.Memset8(p, 9, 4096); err != nil {
				t.Fatalf("the call after the %s: %v", fault, err)
			}
			out := make([]byte, 4096)
			if err := g.CopyDtoH(out, p); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(out, bytes.Repeat([]byte{9}, 4096)) {
				t.Fatalf("after the %s the memory reads %v..., want 9s", fault, out[:8])
			}
			fo := g.Failovers()
			promo := c.Standby.Promoted()
			// The node records its promotion just after it begins to serve
			// (the record carries that moment), so a guest can be answered
			// first: give the record a moment.
			for deadline := time.Now().Add(5 * time.Second); promo == nil && time.Now().Before(deadline); promo = c.Standby.Promoted() {
				time.Sleep(time.Millisecond)
			}
			if len(fo) != 1 || promo == nil || fo[0].Term != promo.Term {
				t.Fatalf("failovers %+v, promotion %+v: want one, to the promoted standby", fo, promo)
			}
			if fault == "freeze" && !fo[0].Stalled {
				t.Errorf("failover %+v: the frozen primary's connection ended", fo[0])
			}
			if fo[0].Looks < 2 {
				t.Errorf("the guest looked %d time(s): it began looking only after the standby served, so it waited for a timeout", fo[0].Looks)
			}
			t.Logf("%s: standby serving %v after the fault, guest resumed %v after it (%v after the standby served), %d looks",
				fault, promo.Serving.Sub(struck).Round(time.Millisecond), fo[0].Resumed.Sub(struck).Round(time.Millisecond),
				fo[0].Resumed.Sub(promo.Serving).Round(time.Millisecond), fo[0].Looks)
		})
	}
}

// TestFrozenPrimaryUnderPipelinedWrites: a guest that only pipelines
// (async copies, no call waiting for a reply) into a frozen primary fills
// the connection's buffers and blocks in its write; the blocked write is a
// stall like a call's, so the guest moves to the promoted standby and its
// copies land there, each once. (More copies than the client queues, so
// the guest blocks before it could make a call.)
func TestFrozenPrimaryUnderPipelinedWrites(t *testing.T) {
	c, px, g := guestViaProxy(t, cluster.Options{})
	const chunk, chunks = 16 << 10, 4000
	p, err := g.Alloc(chunk * chunks)
	if err != nil {
		t.Fatal(err)
	}
	px.Freeze()
	c.KillPrimary()
	done := make(chan error, 1)
	go func() {
		for i := range chunks {
			if err := g.CopyHtoDAsync(p+pvdriver.DevicePtr(i*chunk), bytes.Repeat([]byte{byte(i%251 + 1)}, chunk), 0); err != nil {
				done <- err
				return
			}
		}
		done <- g.Synchronize()
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the guest's pipelined copies into a frozen primary never completed: its blocked write was not taken for a stall")
	}
	out := make([]byte, chunk)
	if err := g.CopyDtoH(out, p+pvdriver.DevicePtr((chunks-1)*chunk)); err != nil {
		t.Fatal(err)
	}
	if want := byte((chunks-1)%251 + 1); !bytes.Equal(out, bytes.Repeat([]byte{want}, chunk)) {
		t.Fatalf("the last chunk reads %v..., want %ds", out[:8], want)
	}
	if fo := g.Failovers(); len(fo) != 1 || !fo[0].Stalled {
		t.Fatalf("failovers %+v: want one, from a stall", fo)
	}
}

// TestSlowPrimaryKeepsItsGuests: a primary that is slow but alive (its
// replies held while its standby's copy of the records is delayed, its
// heartbeats flowing) makes the guest's call wait far longer than the
// stall that sets the guest looking; the standby, not promoted, serves
// nobody, so the guest stays: the call completes on the primary and the
// guest never moves.
func TestSlowPrimaryKeepsItsGuests(t *testing.T) {
	const hold = 600 * time.Millisecond
	var slow atomic.Bool
	hook := func(m link.Message) bool {
		if slow.Load() && m.From == link.FromPrimary && m.Type == "record" {
			time.Sleep(hold)
			slow.Store(false)
		}
		return true
	}
	c, _, g := guestViaProxy(t, cluster.Options{Faults: hook})
	p, err := g.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	slow.Store(true)
	start := time.Now()
	if err := g.Memset8(p, 5, 4096); err != nil {
		t.Fatal(err)
	}
	if err := g.Synchronize(); err != nil { // a commit point: waits for the standby
		t.Fatal(err)
	}
	waited := time.Since(start)
	if slow.Load() {
		t.Fatal("the memset was never replicated")
	}
	if waited < hold {
		t.Fatalf("the guest waited %v, less than the %v its standby was held: the test did not stall it", waited, hold)
	}
	if fo := g.Failovers(); len(fo) != 0 {
		t.Fatalf("a slow primary made its guest move: %+v", fo)
	}
	if c.Standby.Promoted() != nil {
		t.Fatal("the standby took over a live primary")
	}
	out := make([]byte, 4096)
	if err := g.CopyDtoH(out, p); err != nil || !bytes.Equal(out, bytes.Repeat([]byte{5}, 4096)) {
		t.Fatalf("reading back: %v, %v...", err, out[:8])
	}
}

// TestWriteInPiecesSurvivesFailover: a large write that the primary logs
// in pieces (the log's fairness between guests) takes effect exactly once
// across a failover, whether the standby had every piece (the resend is
// answered from its state: the last piece carries the whole request's
// exactly-once sum) or only the first few (the request was not applied
// there: the resend runs it whole).
func TestWriteInPiecesSurvivesFailover(t *testing.T) {
	for _, pieces := range []int{-1, 3} { // -1: every piece reaches the standby
		t.Run(fmt.Sprint("pieces-", pieces), func(t *testing.T) {
			var armed atomic.Bool
			var sent atomic.Int64
			hook := func(m link.Message) bool {
				if !armed.Load() || m.From != link.FromPrimary || m.Type != "record" {
					return true
				}
				return pieces < 0 || sent.Add(1) <= int64(pieces)
			}
			c, _, g := guestViaProxy(t, cluster.Options{Faults: hook})
			const size = 4 << 20 // 16 pieces of a quarter of the default share
			p, err := g.Alloc(size)
			if err != nil {
				t.Fatal(err)
			}
			data := make([]byte, size)
			for i := range data {
				data[i] = byte(i * 7)
			}
			armed.Store(true)
			wrote := make(chan error, 1)
			if pieces < 0 {
				// Pipelined: a resend refused (a wrong sum) would end the
				// guest's connection instead of being dropped as a reply
				// already had.
				if err := g.CopyHtoDAsync(p, data, 0); err != nil {
					t.Fatal(err)
				}
				time.Sleep(100 * time.Millisecond) // every piece reaches the standby
			} else {
				go func() { wrote <- g.CopyHtoD(p, data) }()
				for deadline := time.Now().Add(5 * time.Second); sent.Load() <= int64(pieces); time.Sleep(time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatal("the write never went out in pieces")
					}
				}
			}
			c.KillPrimary()
			if pieces >= 0 {
				if err := <-wrote; err != nil {
					t.Fatalf("the write cut short by the failover: %v", err)
				}
			}
			if err := g.Synchronize(); err != nil {
				t.Fatalf("after the failover: %v", err)
			}
			out := make([]byte, size)
			if err := g.CopyDtoH(out, p); err != nil || !bytes.Equal(out, data) {
				t.Fatalf("after the failover: %v; the memory differs from the write", err)
			}
			if fo := g.Failovers(); len(fo) != 1 {
				t.Fatalf("failovers %+v, want one", fo)
			}
		})
	}
}

// TestFailureCarriedByResync: a pipelined request refused while no
// standby ran (its failure waiting for the guest's next synchronization)
// reaches a standby that joins later through the resync snapshot: after
// a failover the new primary reports it, once.
func TestFailureCarriedByResync(t *testing.T) {
	c, err := cluster.Start(cluster.Options{Replicate: true, Mode: replicate.ModeCommit, Failover: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	g, err := pvdriver.Open(ctx, c.Endpoint, pvdriver.Options{GuestName: "g", Failover: []string{c.StandbyEndpoint}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	p, err := g.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Memset32Async(p+4096, 1, 16, 0); err != nil { // past the allocation: refused
		t.Fatal(err)
	}
	out := make([]byte, 4096)
	if err := g.CopyDtoH(out, p); err != nil { // a commit point: the guest forgets the memset
		t.Fatal(err)
	}
	if err := c.StartStandby(); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitProtected(time.Minute); err != nil {
		t.Fatal(err)
	}
	c.KillPrimary()
	if err := g.Synchronize(); !errors.Is(err, abi.StatusOutOfRange) {
		t.Fatalf("the first synchronization after the failover: %v, want the refused memset's failure", err)
	}
	if err := g.Synchronize(); err != nil {
		t.Fatalf("a second synchronization: %v (a failure is reported once)", err)
	}
	if fo := g.Failovers(); len(fo) != 1 {
		t.Fatalf("failovers %+v, want one", fo)
	}
}
