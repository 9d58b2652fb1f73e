package hypervisor_test

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/replica"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/internal/lab/cluster"
	"github.com/vgpuha/vgpuha/kernels"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
)

func startPair(t *testing.T, opts cluster.Options) *cluster.Cluster {
	t.Helper()
	opts.Replicate, opts.StartStandby, opts.Failover = true, true, true
	opts.Mode = replicate.ModeCommit
	if opts.FailoverAfter == 0 { // a stall on a loaded CI machine is no dead primary
		opts.FailoverAfter = 2 * time.Second
	}
	c, err := cluster.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if err := c.WaitProtected(time.Minute); err != nil {
		t.Fatal(err)
	}
	return c
}

func guest(t *testing.T, c *cluster.Cluster, name string) *pvdriver.Client {
	t.Helper()
	g, err := c.Guest(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// served checks that a guest can allocate, write and read back.
func served(t *testing.T, g *pvdriver.Client, what string) {
	t.Helper()
	start := time.Now()
	p, err := g.Alloc(4096)
	if err != nil {
		t.Fatalf("%s: alloc: %v", what, err)
	}
	want := bytes.Repeat([]byte{0x5a}, 4096)
	if err := g.CopyHtoD(p, want); err != nil {
		t.Fatalf("%s: copy: %v", what, err)
	}
	if got := read(t, g, p, 4096); !bytes.Equal(got, want) {
		t.Fatalf("%s: read back other bytes", what)
	}
	if err := g.Free(p); err != nil {
		t.Fatalf("%s: free: %v", what, err)
	}
	t.Logf("%s: served in %v", what, time.Since(start).Round(time.Microsecond))
}

func loadKernel(t *testing.T, g *pvdriver.Client, name string) pvdriver.Function {
	t.Helper()
	img, _ := kernels.Image(name)
	m, err := g.LoadModule(img)
	if err != nil {
		t.Fatal(err)
	}
	f, err := g.GetFunction(m, name)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestPoisonLaunchFailsOnlyItsGuest: matmul with n = 2^31 on the guest's
// own 4 KiB buffer (4·n·n bytes wraps to zero) used to panic the primary,
// and, after the guest's driver resent it, the standby. Now it fails for
// that guest (told at its sync), on the primary and on the standby that
// takes over, while another guest is served throughout.
func TestPoisonLaunchFailsOnlyItsGuest(t *testing.T) {
	c := startPair(t, cluster.Options{})
	victim, other := guest(t, c, "poisoner"), guest(t, c, "bystander")
	f := loadKernel(t, victim, "matmul")
	p, err := victim.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	poison := func() error {
		one := pvdriver.LaunchConfig{Grid: pvdriver.Dim(1), Block: pvdriver.Dim(1)}
		return victim.Launch(f, one, pvdriver.Ptr(p), pvdriver.Ptr(p), pvdriver.Ptr(p), pvdriver.U32(1<<31))
	}
	if err := poison(); err != nil {
		t.Fatal(err)
	}
	if err := victim.Synchronize(); !errors.Is(err, pvdriver.ErrLaunchFailed) {
		t.Fatalf("poison launch on the primary: %v, want launch failed", err)
	}
	served(t, other, "bystander on the primary")
	served(t, victim, "poisoner after its failed launch")
	if rep, err := c.Verify(); err != nil || !rep.Match {
		t.Fatalf("verify after the poison launch: %+v %v", rep, err)
	}
	if n := c.Standby.Agent().Receiver.Status().ApplyErrors; n != 0 {
		t.Fatalf("standby: %d apply errors", n)
	}

	// Again, with the primary dying before the guest syncs: the guest's
	// driver resends the launch to the promoted standby, which fails it.
	if err := poison(); err != nil {
		t.Fatal(err)
	}
	c.KillPrimary()
	if err := victim.Synchronize(); !errors.Is(err, pvdriver.ErrLaunchFailed) {
		t.Fatalf("poison launch resent to the standby: %v, want launch failed", err)
	}
	if len(victim.Failovers()) != 1 || !c.Standby.Server().IsPrimary() {
		t.Fatalf("failovers %+v; standby serving: %v", victim.Failovers(), c.Standby.Server().IsPrimary())
	}
	served(t, other, "bystander on the promoted standby")
	served(t, victim, "poisoner on the promoted standby")
}

// panicky is a software GPU whose memset of the value boom panics, standing
// in for a bug left in a backend or a kernel.
type panicky struct{ *sim.Backend }

const boom = 0xdead

func (p panicky) NewContext(base, size uint64) (gpu.Context, error) {
	c, err := p.Backend.NewContext(base, size)
	return panickyCtx{c}, err
}

type panickyCtx struct{ gpu.Context }

func (c panickyCtx) Memset(dst uint64, width int, value uint32, count uint64, s gpu.Stream) error {
	if value == boom {
		var m map[int]int
		m[0] = 1 // a nil-map write: a panic from deep inside a request
	}
	return c.Context.Memset(dst, width, value, count, s)
}

func panicCount(t *testing.T, reg prometheus.Gatherer) int {
	t.Helper()
	n, err := testutil.GatherAndCount(reg, "vgpuha_guest_request_panics_total")
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPanicFailsRequestNotNode: a panic while a request changes state fails
// that request (the guest is told) and its session (its state may be torn:
// later requests are refused, the standby drops its copy), is logged and
// counted, and leaves the node serving every other guest. The failed
// request never reaches the standby.
func TestPanicFailsRequestNotNode(t *testing.T) {
	newBackend := func() (gpu.Backend, error) { return panicky{sim.New(1 << 30)}, nil }
	c := startPair(t, cluster.Options{NewBackend: newBackend})
	victim, other := guest(t, c, "victim"), guest(t, c, "other")
	p, err := victim.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	err = victim.Memset32(p, boom, 16)
	var pe *pvdriver.Error
	if !errors.As(err, &pe) || pe.Status != abi.StatusInternal || !strings.Contains(pe.Message, "internal error") {
		t.Fatalf("memset that panicked: %v", err)
	}
	if _, err := victim.Alloc(4096); !errors.As(err, &pe) || !strings.Contains(pe.Message, "failed") {
		t.Fatalf("request on a failed session: %v", err)
	}
	served(t, other, "other guest")
	if err := c.WaitProtected(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	holds := func() bool { // the standby applies after it acknowledges: give it time
		for _, s := range c.Standby.Server().Status().Sessions {
			if s.ID == victim.Session() {
				return true
			}
		}
		return false
	}
	for wait := time.Now().Add(5 * time.Second); holds(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(wait) {
			t.Fatalf("standby still holds the failed session %d", victim.Session())
		}
	}
	if n := c.Standby.Agent().Receiver.Status().ApplyErrors; n != 0 {
		t.Fatalf("standby: %d apply errors (the failed memset reached it?)", n)
	}
	victim.Close()
	deadline := time.Now().Add(5 * time.Second)
	for len(c.Primary.Status().Sessions) != 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := len(c.Primary.Status().Sessions); n != 1 {
		t.Fatalf("primary holds %d sessions after the failed guest left, want 1", n)
	}
}

// TestApplyRecoversPanic: a record whose application panics on the standby
// fails that record and marks its session unsafe; the standby goes on.
func TestApplyRecoversPanic(t *testing.T) {
	reg := prometheus.NewRegistry()
	srv, err := hypervisor.NewServer(panicky{sim.New(1 << 30)}, hypervisor.DefaultConfig(), reg, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	const base = 0x7e0000000000
	recs := []replicate.Record{
		{Op: replicate.OpSessionOpen, Session: 1, Result: base, Body: []byte("g")},
		{Op: replicate.Op(abi.OpAlloc), Session: 1, ReqID: 2, Result: base, Body: (&abi.Alloc{Size: 4096}).Append(nil)},
	}
	for _, r := range recs {
		if err := replica.New(srv, quietLog()).Apply(&r); err != nil {
			t.Fatal(err)
		}
	}
	bad := replicate.Record{Op: replicate.Op(abi.OpMemset), Session: 1, ReqID: 3, Body: (&abi.Memset{Dst: base, Width: 4, Value: boom, Count: 1}).Append(nil)}
	if err := replica.New(srv, quietLog()).Apply(&bad); err == nil {
		t.Fatal("a record whose apply panicked reported success")
	}
	if st := srv.Status(); len(st.Sessions) != 1 || st.Sessions[0].Unsafe == "" {
		t.Fatalf("session after a panicking record: %+v", st.Sessions)
	}
	if panicCount(t, reg) != 1 {
		t.Fatal("the recovered panic was not counted")
	}
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
