package pvdriver_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// serveNode serves guests from a node on backend b at the unix socket
// path, until the test ends, and returns the node and its endpoint.
func serveNode(t *testing.T, b gpu.Backend, path string) (*hypervisor.Server, string) {
	t.Helper()
	srv, err := hypervisor.NewServer(b, hypervisor.DefaultConfig(), prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	return srv, "unix://" + path
}

// TestHelloCutOffMovesOn: a node that takes a guest's hello and dies
// before it answers (a primary killed mid-hello) leaves the guest with no
// session to resume: Open goes on to the next endpoint and opens one
// session there, instead of "resuming" session 0 (which opened a second
// session and then failed: "session N is already open on this
// connection").
func TestHelloCutOffMovesOn(t *testing.T) {
	dir := t.TempDir()
	dying, err := net.Listen("unix", filepath.Join(dir, "dying.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer dying.Close()
	var hellos atomic.Int32
	go func() {
		for {
			conn, err := dying.Accept()
			if err != nil {
				return
			}
			if _, err := abi.NewFrameReader(conn, 4096).ReadFrame(); err == nil {
				hellos.Add(1)
			}
			conn.Close()
		}
	}()
	srv, nextEP := serveNode(t, sim.New(1<<30), filepath.Join(dir, "next.sock"))

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	g, err := pvdriver.Open(ctx, "unix://"+dying.Addr().String(), pvdriver.Options{GuestName: "g", Failover: []string{nextEP}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := g.Alloc(4096); err != nil {
		t.Fatal(err)
	}
	if n := hellos.Load(); n != 1 {
		t.Fatalf("the dying node got %d hellos, want 1", n)
	}
	if st := srv.Status(); len(st.Sessions) != 1 || st.Sessions[0].ID != g.Session() {
		t.Fatalf("the next node holds %+v, want the guest's one session %d", st.Sessions, g.Session())
	}
	g.Close()
	if st := srv.Status(); len(st.Sessions) != 0 {
		t.Fatalf("Close returned before the node freed the session: %+v", st.Sessions)
	}
}

// TestDeposedNodeSendsGuestOn: a node whose coordinator lease ran out (it
// was deposed, though not yet fenced) refuses a new guest's hello at
// once as unavailable, and the guest opens its session on the next
// endpoint in the same round.
func TestDeposedNodeSendsGuestOn(t *testing.T) {
	dir := t.TempDir()
	deposed, deposedEP := serveNode(t, sim.New(1<<30), filepath.Join(dir, "deposed.sock"))
	expired := time.Now().Add(-time.Second)
	deposed.SetRole(hypervisor.Role{Term: 1, Lease: func() time.Time { return expired }, Unprotected: func() (bool, bool) { return false, true }})
	next, nextEP := serveNode(t, sim.New(1<<30), filepath.Join(dir, "next.sock"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	g, err := pvdriver.Open(ctx, deposedEP, pvdriver.Options{GuestName: "g", Failover: []string{nextEP}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if n, m := len(deposed.Status().Sessions), len(next.Status().Sessions); n != 0 || m != 1 {
		t.Fatalf("sessions: %d on the deposed node, %d on the next; want 0 and 1", n, m)
	}
	if f := g.Failovers(); len(f) != 0 {
		t.Fatalf("the guest counts a failover it never made: %+v", f)
	}
}

// slowContexts is the software GPU making each context in delay, as a
// GPU worker that must first open the GPU does while many guests start.
type slowContexts struct {
	*sim.Backend
	delay time.Duration
}

func (b slowContexts) NewContext(base, size uint64) (gpu.Context, error) {
	time.Sleep(b.delay)
	return b.Backend.NewContext(base, size)
}

// TestSlowSessionOpenIsWaitedFor: a node that takes 4 s to open a new
// session still opens it for a guest with failover endpoints, once. A
// new session's hello is waited for longer than a resume's: the guest
// used to give up after 3 s, and every retry needed 4 s again.
func TestSlowSessionOpenIsWaitedFor(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: a session that takes 4 s to open")
	}
	dir := t.TempDir()
	srv, ep := serveNode(t, slowContexts{sim.New(1 << 30), 4 * time.Second}, filepath.Join(dir, "slow.sock"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	g, err := pvdriver.Open(ctx, ep, pvdriver.Options{GuestName: "g", Failover: []string{"unix://" + filepath.Join(dir, "nobody.sock")}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := g.Alloc(4096); err != nil {
		t.Fatal(err)
	}
	if st := srv.Status(); len(st.Sessions) != 1 || st.Sessions[0].ID != g.Session() {
		t.Fatalf("the node holds %+v, want the guest's one session %d", st.Sessions, g.Session())
	}
}
