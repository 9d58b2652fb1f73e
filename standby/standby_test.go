package standby_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/replica"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/internal/lab/cluster"
	"github.com/vgpuha/vgpuha/internal/lab/workload"
	"github.com/vgpuha/vgpuha/internal/node"
	"github.com/vgpuha/vgpuha/kernels"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/replicate"
	"github.com/vgpuha/vgpuha/replicate/verify"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// fixture is the shared in-process primary+standby, failing the test on
// errors.
type fixture struct {
	*cluster.Cluster
	t *testing.T
}

func newCluster(t *testing.T, mode replicate.Mode, shift uint64, withStandby bool) *fixture {
	t.Helper()
	return newClusterLag(t, mode, shift, withStandby, 8<<20)
}

// newClusterLag is newCluster with the log's lag bound (what it keeps for
// a standby that is behind or detached) at maxLag bytes.
func newClusterLag(t *testing.T, mode replicate.Mode, shift uint64, withStandby bool, maxLag int64) *fixture {
	t.Helper()
	c, err := cluster.Start(cluster.Options{Replicate: true, Mode: mode, StandbyShift: shift, StartStandby: withStandby, MaxLagBytes: maxLag})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return &fixture{Cluster: c, t: t}
}

func (c *fixture) startStandby() {
	c.t.Helper()
	if err := c.StartStandby(); err != nil {
		c.t.Fatal(err)
	}
}

func (c *fixture) waitProtected() {
	c.t.Helper()
	if err := c.WaitProtected(time.Minute); err != nil {
		c.t.Fatal(err)
	}
}

func (c *fixture) verify() verify.Report {
	c.t.Helper()
	rep, err := c.Verify()
	if err != nil {
		c.t.Fatal(err)
	}
	return rep
}

// waitPromoted waits up to timeout for the standby to take over.
func (c *fixture) waitPromoted(timeout time.Duration) {
	c.t.Helper()
	for deadline := time.Now().Add(timeout); c.Standby.Promoted() == nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			c.t.Fatal("the standby did not take over")
		}
	}
}

func (c *fixture) guest(name string) *pvdriver.Client {
	c.t.Helper()
	g, err := c.Guest(name)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { g.Close() })
	return g
}

// runGuests runs every workload in n concurrent guests that stay connected.
func (c *fixture) runGuests(n, size int) {
	c.t.Helper()
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		g := c.guest("g")
		wg.Add(1)
		go func() {
			defer wg.Done()
			ws, _ := workload.Select("all")
			for _, w := range ws {
				r, err := w.Run(context.Background(), g, size)
				if err != nil {
					c.t.Error(err)
					return
				}
				if !r.Verified {
					c.t.Errorf("%s: %s", r.Name, r.Detail)
				}
			}
		}()
	}
	wg.Wait()
}

func mustMatch(t *testing.T, rep verify.Report) {
	t.Helper()
	if !rep.Match || rep.Objects == 0 {
		t.Fatalf("replica differs: %d objects, mismatches %+v", rep.Objects, rep.Mismatches)
	}
}

// TestModesReplicaIdentical: for every mode, three guests run every
// workload and the replica ends bit-identical.
func TestModesReplicaIdentical(t *testing.T) {
	for _, mode := range []replicate.Mode{replicate.ModeSync, replicate.ModeCommit, replicate.ModeAsync, replicate.ModeEpoch} {
		t.Run(mode.String(), func(t *testing.T) {
			c := newCluster(t, mode, 0, true)
			c.waitProtected()
			c.runGuests(3, 0)
			rep := c.verify()
			mustMatch(t, rep)
			t.Logf("%s: %d objects, %d bytes identical", mode, rep.Objects, rep.Bytes)
		})
	}
}

// TestStandbyLateAndRestarted: a standby that starts mid-run is resynced
// from a snapshot; one restarted mid-run (a fresh replica) is too; both end
// identical while the guests keep running.
func TestStandbyLateAndRestarted(t *testing.T) {
	c := newCluster(t, replicate.ModeCommit, 0, false)
	c.runGuests(2, 0) // no standby: the primary serves unprotected
	if st := c.Sender.Status(); st.State != "unprotected" {
		t.Fatalf("state without a standby: %s", st.State)
	}
	c.startStandby()
	mustMatch(t, c.verify())
	if c.Sender.Status().Resyncs != 1 {
		t.Errorf("resyncs: %d", c.Sender.Status().Resyncs)
	}
	c.runGuests(2, 0)
	c.StopStandby()
	c.runGuests(1, 0) // while the standby is down
	c.startStandby()
	mustMatch(t, c.verify())
	if e := c.Sender.Status().LastError; e != "" {
		t.Errorf("status keeps the error of the link that broke while the standby was down: %q", e)
	}
	c.runGuests(1, 0)
	mustMatch(t, c.verify())
}

// TestLinkCutResumesFromLog: a broken link to a standby that kept its state
// catches up from the log, without a snapshot.
func TestLinkCutResumesFromLog(t *testing.T) {
	// One guest's run logs about 8.5 MB (its device reads are logged too,
	// as read-backs): the log must keep more than that for the detached
	// standby, or dropping it and resyncing is the right answer.
	c := newClusterLag(t, replicate.ModeAsync, 0, true, 64<<20)
	c.waitProtected()
	c.runGuests(1, 0)
	// Async mode lets the standby lag by up to the log's bound; cut only
	// once it caught up, or the records written during the cut may exceed
	// what the log keeps for a detached standby and force a (legitimate)
	// resync.
	deadline := time.Now().Add(10 * time.Second)
	for c.Sender.Status().LagOps != 0 && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond)
	}
	c.Standby.Agent().Receiver.Close() // cut the link; the standby keeps its replica
	c.runGuests(1, 0)
	mustMatch(t, c.verify())
	if n := c.Sender.Status().Resyncs; n != 1 {
		t.Errorf("resyncs after a link cut: %d, want 1 (the first attach only)", n)
	}
}

// TestTranslatedBase: a standby whose windows land at another base
// translates addresses: everything but pointer_chase verifies identical,
// and pointer_chase's session is reported unsafe instead of silently wrong.
func TestTranslatedBase(t *testing.T) {
	c := newCluster(t, replicate.ModeSync, 1<<40, true)
	c.waitProtected()
	g := c.guest("translated")
	for _, name := range []string{"vadd", "saxpy", "matmul", "reduce_sum", "histogram"} {
		w, _ := workload.Lookup(name)
		if r, err := w.Run(context.Background(), g, 0); err != nil || !r.Verified {
			t.Fatalf("%s: %v %+v", name, err, r)
		}
	}
	mustMatch(t, c.verify())
	st := c.StandbyStatus().Replica.Sessions
	if len(st) != 1 || !st[0].Translated || st[0].Unsafe != "" {
		t.Fatalf("replica session: %+v", st)
	}
	w, _ := workload.Lookup("pointer_chase")
	if r, err := w.Run(context.Background(), g, 256); err != nil || !r.Verified {
		t.Fatalf("pointer_chase on the primary: %v %+v", err, r)
	}
	// The workload read its output back, so the replica holds those bytes
	// (read-backs); what marks the replica is its unsafe status.
	st = c.StandbyStatus().Replica.Sessions
	if !strings.Contains(st[0].Unsafe, "translated") {
		t.Errorf("pointer_chase on a translated replica not reported unsafe: %q", st[0].Unsafe)
	}
	// Refused before it runs (on a GPU in one process it would read the
	// primary's memory through the stored pointers and seem to work).
	if !strings.Contains(st[0].Unsafe, "follows pointers stored in device memory and this node's addresses differ") {
		t.Errorf("the replica ran pointer_chase at translated addresses instead of refusing it: %q", st[0].Unsafe)
	}
}

// divergedReplica starts a pair whose guest wrote 64 KiB of 7s, and then
// changes three of the replica's bytes behind replication's back (at
// offset 100), as a flaky device, a bug or a kernel that is not
// reproducible would.
func divergedReplica(t *testing.T) (*fixture, *pvdriver.Client, pvdriver.DevicePtr) {
	c := newCluster(t, replicate.ModeCommit, 0, true)
	c.waitProtected()
	g := c.guest("g")
	p, err := g.Alloc(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.CopyHtoD(p, bytes.Repeat([]byte{7}, 1<<16)); err != nil {
		t.Fatal(err)
	}
	mustMatch(t, c.verify()) // the standby has applied the copy
	replica.New(c.Standby.Server(), quiet()).Apply(&replicate.Record{Session: g.Session(), Op: replicate.Op(4 /* copy_htod */), Flags: replicate.FlagRepair,
		Body: appendCopy(uint64(p)+100, []byte{1, 2, 3})})
	return c, g, p
}

// TestRepair: a replica object changed behind replication's back is found
// by verify and repaired from the primary.
func TestRepair(t *testing.T) {
	c, g, p := divergedReplica(t)
	rep := c.verify()
	if rep.Match || len(rep.Mismatches) != 1 || !rep.Mismatches[0].Repairable {
		t.Fatalf("corrupted replica: %+v", rep)
	}
	if err := c.Primary.Repair(g.Session(), uint64(p)); err != nil {
		t.Fatal(err)
	}
	mustMatch(t, c.verify())
}

// TestReadBackRepairsWhatTheGuestRead: where the replica's bytes differ
// from the primary's (as after a kernel with floating-point atomics), a
// guest's read puts the bytes it got into the replica: a read that covers
// the difference repairs it, one that does not leaves it for verify.
func TestReadBackRepairsWhatTheGuestRead(t *testing.T) {
	c, g, p := divergedReplica(t)
	buf := make([]byte, 64)
	if err := g.CopyDtoH(buf, p); err != nil { // [0, 64): not the diverged bytes
		t.Fatal(err)
	}
	if rep := c.verify(); rep.Match {
		t.Fatalf("a read of other bytes repaired the replica: %+v", rep)
	}
	if err := g.CopyDtoH(buf, p+64); err != nil { // [64, 128) holds them
		t.Fatal(err)
	}
	if !bytes.Equal(buf, bytes.Repeat([]byte{7}, 64)) {
		t.Fatalf("the guest read %v from the primary", buf)
	}
	mustMatch(t, c.verify())
}

// TestModuleImagesByHash: a second process of the same tenant loads an
// image by its hash from the primary's cache, the log carries the image to
// the standby once, and the standby's replica loads it from there.
func TestModuleImagesByHash(t *testing.T) {
	c := newCluster(t, replicate.ModeCommit, 0, true)
	c.waitProtected()
	w, _ := workload.Lookup("vadd")
	for i, name := range []string{"first", "second", "third"} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		g, err := pvdriver.Open(ctx, c.Endpoint, pvdriver.Options{GuestName: name, HashImagesFrom: 1})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if r, err := w.Run(context.Background(), g, 0); err != nil || !r.Verified {
			t.Fatalf("%s: %v %+v", name, err, r)
		}
		mustMatch(t, c.verify())
		if i < 2 {
			g.Close()
		} else {
			defer g.Close()
		}
	}
	if st := c.Primary.Status().Images; st.Cached != 1 || st.Shipped != 1 {
		t.Errorf("primary's images after three processes loading one: %+v (want 1 cached, shipped once)", st)
	}
	sv := c.StandbyStatus()
	if sv.Replica.Images.Received != 1 || sv.Replication.ApplyErrors != 0 {
		t.Errorf("standby: images %+v, apply errors %d", sv.Replica.Images, sv.Replication.ApplyErrors)
	}
	for _, ss := range sv.Replica.Sessions {
		if ss.Unsafe != "" {
			t.Errorf("replica session %d: %s", ss.ID, ss.Unsafe)
		}
	}
}

func appendCopy(dst uint64, data []byte) []byte {
	b := make([]byte, 0, 20+len(data))
	for i := 0; i < 8; i++ {
		b = append(b, byte(dst>>(8*i)))
	}
	b = append(b, make([]byte, 8)...) // stream 0
	n := uint32(len(data))
	b = append(b, byte(n), byte(n>>8), byte(n>>16), byte(n>>24))
	return append(b, data...)
}

// TestRefusesUnauthenticatedAndCorrupt: a peer with the wrong key, or a
// stream with a flipped bit, is refused and nothing from it is applied.
func TestRefusesUnauthenticatedAndCorrupt(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: waits out a refused sender (about 2.5 s)")
	}
	c := newCluster(t, replicate.ModeCommit, 0, true)
	c.waitProtected()
	// A primary with the wrong key.
	addr := c.Sender.Status().Standby
	wrong, _ := replicate.NewSender(replicate.SenderConfig{Addr: addr, Key: []byte("not-the-right-key-at-all"), Log: replicate.NewLog(1 << 20),
		Logger: quiet()}, emptyNode{})
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	wrong.Run(ctx)
	cancel()
	if st := c.Standby.Agent().Receiver.Status(); st.RefusedPeers == 0 {
		t.Errorf("wrong key not refused: %+v", st)
	}
	if s := wrong.Status(); !strings.Contains(s.LastError, "authentication") {
		t.Errorf("sender with the wrong key: %q", s.LastError)
	}
	// Raw garbage and a replayed handshake.
	for _, junk := range [][]byte{[]byte("GET / HTTP/1.0\r\n\r\n"), append([]byte("VGRA\x01\x00"), make([]byte, 64)...)} {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conn.Write(junk)
		conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		io.ReadAll(conn)
		conn.Close()
	}
	if n := len(c.StandbyStatus().Replica.Sessions); n != 0 {
		t.Fatalf("refused peers created %d replica sessions", n)
	}
	// The real primary still streams.
	c.runGuests(1, 0)
	mustMatch(t, c.verify())
}

func TestStandbyMetricsLint(t *testing.T) {
	reg := prometheus.NewRegistry()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.StartStandby(node.Config{Backend: sim.New(1 << 20), Hypervisor: hypervisor.DefaultConfig(), Key: cluster.Key,
		Registry: reg, Logger: quiet()}, ln)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("metric %s: %s", p.Metric, p.Text)
	}
}

// emptyNode is a primary with nothing to snapshot, for a sender that must
// be refused.
type emptyNode struct{}

func (emptyNode) Snapshot() (replicate.Snapshot, error) { return nil, errors.New("no snapshot") }
func (emptyNode) Term() uint64                          { return 1 }
func (emptyNode) PeerTerm(uint64)                       {}

// TestLongKernelDoesNotHoldOthersReplies: in commit mode, while the standby
// applies guest B's long kernel, guest A's small read returns at once: the
// commit rule waits for what the standby holds, not for what it applied.
func TestLongKernelDoesNotHoldOthersReplies(t *testing.T) {
	c := newCluster(t, replicate.ModeCommit, 0, true)
	c.waitProtected()
	a, b := c.guest("a"), c.guest("b")
	small := make([]byte, 4096)
	pa, err := a.Alloc(uint64(len(small)))
	if err != nil || a.CopyHtoD(pa, small) != nil {
		t.Fatal("guest a's buffer", err)
	}
	const n = 448 // a matmul that keeps the software GPU busy for a while
	img, _ := kernels.Image("matmul")
	m, err := b.LoadModule(img)
	if err != nil {
		t.Fatal(err)
	}
	f, err := b.GetFunction(m, "matmul")
	if err != nil {
		t.Fatal(err)
	}
	var ptrs [3]pvdriver.DevicePtr
	for i := range ptrs {
		if ptrs[i], err = b.Alloc(4 * n * n); err != nil {
			t.Fatal(err)
		}
	}
	cfg := pvdriver.LaunchConfig{Grid: pvdriver.Dim3((n+15)/16, (n+15)/16), Block: pvdriver.Dim3(16, 16)}
	if err := b.Launch(f, cfg, pvdriver.Ptr(ptrs[0]), pvdriver.Ptr(ptrs[1]), pvdriver.Ptr(ptrs[2]), pvdriver.U32(n)); err != nil {
		t.Fatal(err)
	}
	// The launch is pipelined: the primary runs it, logs it, and the
	// standby starts applying it. Look once the standby is busy with it.
	rcv := c.Standby.Agent().Receiver
	busy := func() bool { st := rcv.Status(); return st.Received > st.Applied }
	deadline := time.Now().Add(60 * time.Second)
	for !busy() && time.Now().Before(deadline) {
		time.Sleep(100 * time.Microsecond)
	}
	busyFrom := time.Now()
	if err := a.CopyDtoH(small, pa); err != nil {
		t.Fatal(err)
	}
	read := time.Since(busyFrom)
	for busy() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	applying := time.Since(busyFrom)
	t.Logf("guest a's 4 KiB read: %v, while the standby applied guest b's kernel for %v", read, applying)
	if applying < 100*time.Millisecond {
		t.Skipf("b's kernel took the standby only %v: too short to show anything", applying)
	}
	if read > 50*time.Millisecond {
		t.Fatalf("a's read took %v behind b's kernel (%v on the standby)", read, applying)
	}
	if err := b.Synchronize(); err != nil {
		t.Fatal(err)
	}
	mustMatch(t, c.verify())
}
