package node_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/failover"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/internal/node"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/replicate"
	"github.com/vgpuha/vgpuha/replicate/link"
)

var key = []byte("node-test-key-0123456789abcdef01")

func config(t *testing.T, guests string) node.Config {
	det, err := failover.New("fixed")
	if err != nil {
		t.Fatal(err)
	}
	return node.Config{Backend: sim.New(1 << 28), Hypervisor: hypervisor.DefaultConfig(), Key: key, Mode: replicate.ModeCommit,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), GuestListen: guests, Detector: det}
}

func listen(t *testing.T) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func protected(n *node.Node) func() bool {
	return func() bool { return n.Sender() != nil && n.Sender().Status().Protected }
}

// TestPromotedNodeIsAFullPrimary: A replicates to B, B (once promoted) to
// C. A dies; B takes over, protects itself with C, and answers verify and
// a switchover like the first primary; C takes over under term 3, and the
// guest's data survives both moves.
func TestPromotedNodeIsAFullPrimary(t *testing.T) {
	dir := t.TempDir()
	ep := func(name string) string { return "unix://" + filepath.Join(dir, name) }
	lnC, lnB := listen(t), listen(t)
	c, err := node.StartStandby(config(t, ep("c.sock")), lnC)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cfgB := config(t, ep("b.sock"))
	cfgB.ReplicateTo = []string{lnC.Addr().String()}
	b, err := node.StartStandby(cfgB, lnB)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	cfgA := config(t, ep("a.sock"))
	cfgA.ReplicateTo = []string{lnB.Addr().String()}
	a, err := node.StartPrimary(cfgA)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g, err := pvdriver.Open(ctx, ep("a.sock"), pvdriver.Options{GuestName: "g", Failover: []string{ep("b.sock"), ep("c.sock")}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	data := bytes.Repeat([]byte("survives two moves "), 1000)
	p, err := g.Alloc(uint64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	if err := g.CopyHtoD(p, data); err != nil {
		t.Fatal(err)
	}
	if err := g.Synchronize(); err != nil { // a commit point: nothing left to resend
		t.Fatal(err)
	}
	waitFor(t, "A protected by B", protected(a))

	a.Log().Close() // a crash: nothing more reaches B
	a.Close()
	waitFor(t, "B promoted", func() bool { return b.Promoted() != nil })
	// A guest starting now, given the dead primary first, is served by B.
	start := time.Now()
	octx, ocancel := context.WithTimeout(context.Background(), 5*time.Second)
	g2, err := pvdriver.Open(octx, ep("a.sock"), pvdriver.Options{GuestName: "late", Failover: []string{ep("b.sock"), ep("c.sock")}})
	ocancel()
	if err != nil {
		t.Fatalf("a guest starting after the takeover: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("a guest starting after the takeover waited %v", d)
	}
	g2.Close()
	waitFor(t, "B protected by C", protected(b))
	rep, err := b.Verify(node.VerifyOptions{}, 10*time.Second)
	if err != nil || !rep.Match || rep.Objects == 0 {
		t.Fatalf("verify on the promoted node: %+v, %v", rep, err)
	}
	if _, term, err := b.Switchover(10 * time.Second); err != nil || term != 3 {
		t.Fatalf("switchover from the promoted node: term %d, %v", term, err)
	}
	waitFor(t, "C promoted", func() bool { return c.Promoted() != nil })
	if role, term := b.Role(); role != failover.Fenced || term != 3 {
		t.Errorf("B after the switchover: %s term %d, want fenced term 3", role, term)
	}
	if role, term := c.Role(); role != failover.Primary || term != 3 {
		t.Errorf("C after the switchover: %s term %d, want primary term 3", role, term)
	}
	got := make([]byte, len(data))
	if err := g.CopyDtoH(got, p); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("guest data after two moves: equal=%v, %v", bytes.Equal(got, data), err)
	}
	// The guest resumes on B if it noticed A's death before the
	// switchover, then on C; or on C at once.
	if fo := g.Failovers(); len(fo) == 0 || len(fo) > 2 || fo[len(fo)-1].Term != 3 || fo[len(fo)-1].Endpoint != ep("c.sock") {
		t.Errorf("guest's failovers: %+v", fo)
	}
}

// TestLostHandOverChangesNothing: the link's fault hook drops the primary's
// switchover request; the switchover fails in time and both nodes keep
// their roles (no sleep decides the outcome, the hook does).
func TestLostHandOverChangesNothing(t *testing.T) {
	dir := t.TempDir()
	lnB := listen(t)
	cfgB := config(t, "unix://"+filepath.Join(dir, "b.sock"))
	// Not a detection test: a loaded machine must not make B take over.
	cfgB.Detector = &failover.Fixed{Timeout: time.Minute}
	b, err := node.StartStandby(cfgB, lnB)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var dropped atomic.Int32
	cfgA := config(t, "unix://"+filepath.Join(dir, "a.sock"))
	cfgA.ReplicateTo = []string{lnB.Addr().String()}
	cfgA.Faults = func(m link.Message) bool {
		if m.Type == "promote" {
			dropped.Add(1)
			return false
		}
		return true
	}
	a, err := node.StartPrimary(cfgA)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	waitFor(t, "A protected", protected(a))
	// A serving guests: its listener loop starts on its own goroutine, and
	// a switchover holds the server while it waits.
	waitFor(t, "A serving", a.Server().IsPrimary)
	if _, _, err := a.Switchover(300 * time.Millisecond); err == nil {
		t.Fatal("switchover succeeded although its request was dropped")
	}
	if dropped.Load() != 1 {
		t.Fatalf("the hook dropped %d promote messages, want 1", dropped.Load())
	}
	if role, term := a.Role(); role != failover.Primary || term != 1 {
		t.Errorf("A: %s term %d, want primary term 1", role, term)
	}
	if role, _ := b.Role(); role != failover.Standby || b.Promoted() != nil {
		t.Errorf("B: %s, promoted %+v; want a standby", role, b.Promoted())
	}
	if !a.Server().IsPrimary() {
		t.Error("A stopped serving guests")
	}
}

// TestPromotionRetriesABusyEndpoint: a standby whose guest endpoint cannot
// be listened on when it takes over keeps trying, and serves once it can.
func TestPromotionRetriesABusyEndpoint(t *testing.T) {
	dir := t.TempDir()
	sockB := filepath.Join(dir, "b.sock")
	if err := os.WriteFile(sockB, []byte("not a socket"), 0o600); err != nil { // Listen refuses to remove it
		t.Fatal(err)
	}
	lnB := listen(t)
	b, err := node.StartStandby(config(t, "unix://"+sockB), lnB)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	cfgA := config(t, "unix://"+filepath.Join(dir, "a.sock"))
	cfgA.ReplicateTo = []string{lnB.Addr().String()}
	a, err := node.StartPrimary(cfgA)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "A protected", protected(a))
	a.Log().Close()
	a.Close()
	waitFor(t, "B promoted", func() bool { return b.Promoted() != nil })
	if b.Server().IsPrimary() {
		t.Fatal("B serves although its endpoint is a plain file")
	}
	os.Remove(sockB)
	waitFor(t, "B serving once its endpoint is free", b.Server().IsPrimary)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	g, err := pvdriver.Open(ctx, "unix://"+sockB, pvdriver.Options{GuestName: "late"})
	if err != nil {
		t.Fatalf("a guest on the promoted node: %v", err)
	}
	g.Close()
}
