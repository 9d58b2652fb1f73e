package hypervisor_test

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/replica"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/internal/lab/cluster"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
	"github.com/vgpuha/vgpuha/replicate/link"
)

// fakeClock is a clock a test moves by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// sessionByID returns session id's status, or false if the node has none.
func sessionByID(srv *hypervisor.Server, id uint64) (hypervisor.SessionStatus, bool) {
	for _, s := range srv.Status().Sessions {
		if s.ID == id {
			return s, true
		}
	}
	return hypervisor.SessionStatus{}, false
}

// waitSessionDetached waits until the server has seen session id's connection end
// (it notices that on its own goroutine).
func waitSessionDetached(t *testing.T, srv *hypervisor.Server, id uint64) hypervisor.SessionStatus {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; {
		if s, ok := sessionByID(srv, id); ok && s.Detached {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("session %d never detached: %+v", id, srv.Status())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestDetachedSessionExpiresOnServerClock: a session whose connection
// ended is kept for its grace period by the server's clock, shows in
// status how long it has been detached, and is freed (and counted) when
// the grace runs out.
func TestDetachedSessionExpiresOnServerClock(t *testing.T) {
	clock := newFakeClock()
	cfg := hypervisor.DefaultConfig()
	cfg.Clock = clock.Now
	e := start(t, cfg)
	r := dialRaw(t, e)
	var hr abi.HelloReply
	if st, msg := r.send(abi.OpHello, 0, 1, &abi.Hello{GuestName: "g", GraceMS: 5000}, &hr); st != abi.StatusOK {
		t.Fatal(msg)
	}
	r.conn.Close()
	if s := waitSessionDetached(t, e.srv, hr.Session); s.DetachedSeconds != 0 || s.ExpiresInSeconds != 5 {
		t.Fatalf("just detached: %+v", s)
	}
	clock.advance(3 * time.Second)
	e.srv.ExpireDetached()
	s, ok := sessionByID(e.srv, hr.Session)
	if !ok || s.DetachedSeconds != 3 || s.ExpiresInSeconds != 2 || e.srv.Status().OldestDetachedSeconds != 3 {
		t.Fatalf("3 s into a 5 s grace: %+v (kept %v)", s, ok)
	}
	clock.advance(2 * time.Second)
	e.srv.ExpireDetached()
	if _, ok := sessionByID(e.srv, hr.Session); ok {
		t.Fatal("session kept past its grace period")
	}
	if n := counter(t, e, "vgpuha_guest_sessions_expired_total", nil); n != 1 {
		t.Fatalf("expired sessions counted %v, want 1", n)
	}
}

// TestPromotedNodeAdoptsDetachedSessions: a standby keeps its replicas
// without a clock (its primary frees them), however long; once it serves
// guests it owns them: each is kept for its grace period from then, a
// guest may resume it meanwhile, and the others are freed.
func TestPromotedNodeAdoptsDetachedSessions(t *testing.T) {
	clock := newFakeClock()
	cfg := hypervisor.DefaultConfig()
	cfg.Clock = clock.Now
	cfg.MaxGrace = 10 * time.Second
	srv, err := hypervisor.NewServer(sim.New(1<<30), cfg, prometheus.NewRegistry(), quietLog())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	token := bytes.Repeat([]byte{7}, abi.ResumeTokenSize)
	base := func(slot uint64) uint64 { return cfg.WindowBase + slot*cfg.WindowSize }
	for _, rec := range [...]struct {
		id    uint64
		grace time.Duration
	}{{1, 5 * time.Second}, {2, 5 * time.Second}, {3, 0}, {4, time.Hour}} {
		r := hypervisor.SessionOpenRecord(rec.id, base(rec.id-1), "g", "uid:0", token, rec.grace)
		if err := replica.New(srv, quietLog()).Apply(&r); err != nil {
			t.Fatal(err)
		}
	}
	clock.advance(time.Hour)
	srv.ExpireDetached()
	if st := srv.Status(); len(st.Sessions) != 4 || st.Detached != 4 || st.OldestDetachedSeconds != 0 {
		t.Fatalf("a standby let go of replicas its primary owns: %+v", st)
	}

	sock := filepath.Join(t.TempDir(), "g.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	for deadline := time.Now().Add(5 * time.Second); !srv.IsPrimary(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("never served")
		}
	}
	// Session 3's guest asked for no grace: nobody can resume it.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, ok := sessionByID(srv, 3); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a session without grace was kept after the takeover")
		}
	}
	if s, _ := sessionByID(srv, 4); s.ExpiresInSeconds != 10 {
		t.Fatalf("adopted grace not capped by this node's: %+v", s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	g, err := pvdriver.Open(ctx, "unix://"+sock, pvdriver.Options{GuestName: "g", ResumeSession: 1, ResumeToken: token})
	if err != nil {
		t.Fatalf("resuming an adopted session: %v", err)
	}
	defer g.Close()
	clock.advance(4 * time.Second)
	srv.ExpireDetached()
	if st := srv.Status(); len(st.Sessions) != 3 || st.Detached != 2 || st.OldestDetachedSeconds != 4 {
		t.Fatalf("4 s after the takeover: %+v", st)
	}
	clock.advance(time.Second)
	srv.ExpireDetached()
	if _, ok := sessionByID(srv, 2); ok {
		t.Fatal("adopted session 2 kept past its grace period")
	}
	if _, ok := sessionByID(srv, 1); !ok {
		t.Fatal("the resumed session was freed")
	}
	clock.advance(5 * time.Second)
	srv.ExpireDetached()
	if st := srv.Status(); len(st.Sessions) != 1 || st.Detached != 0 {
		t.Fatalf("after every grace ran out: %+v", st)
	}
	served(t, g, "the resumed session")
}

// slowClose is a software GPU whose contexts take a while to close, as a
// CUDA context does (its memory is unmapped and freed).
type slowClose struct{ *sim.Backend }

func (b slowClose) NewContext(base, size uint64) (gpu.Context, error) {
	ctx, err := b.Backend.NewContext(base, size)
	return slowCloseContext{ctx}, err
}

type slowCloseContext struct{ gpu.Context }

func (c slowCloseContext) Close() error {
	time.Sleep(50 * time.Millisecond)
	return c.Context.Close()
}

// TestProgramsOneAfterAnother: with one session slot, guests that open a
// session, use it and close it, one right after another, are all served:
// Close returns once the node has freed the session (its backend context
// takes 50 ms to close). Half of them can fail over (the node would keep
// their session for a resume, were it not closed on purpose).
func TestProgramsOneAfterAnother(t *testing.T) {
	cfg := hypervisor.DefaultConfig()
	cfg.MaxSessions = 1
	srv, err := hypervisor.NewServer(slowClose{sim.New(1 << 30)}, cfg, prometheus.NewRegistry(), quietLog())
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "g.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	endpoint := "unix://" + sock
	for i := 0; i < 20; i++ {
		opts := pvdriver.Options{GuestName: "program"}
		if i%2 == 1 {
			opts.Failover = []string{endpoint}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		g, err := pvdriver.Open(ctx, endpoint, opts)
		cancel()
		if err != nil {
			t.Fatalf("program %d: %v", i, err)
		}
		served(t, g, "a program")
		g.Close()
	}
}

// TestHelloWaitsForClosingSlot: a hello that finds the only slot held by a
// session being let go waits for it instead of being refused.
func TestHelloWaitsForClosingSlot(t *testing.T) {
	cfg := hypervisor.DefaultConfig()
	cfg.MaxSessions = 1
	e := start(t, cfg)
	r := dialRaw(t, e)
	if st, msg := r.send(abi.OpHello, 0, 1, &abi.Hello{GuestName: "leaving"}, &abi.HelloReply{}); st != abi.StatusOK {
		t.Fatal(msg)
	}
	done := e.srv.SessionEnding() // as if its connection had just ended
	opened := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		g, err := pvdriver.Open(ctx, e.endpoint, pvdriver.Options{GuestName: "next"})
		if err == nil {
			g.Close()
		}
		opened <- err
	}()
	r.conn.Close()
	if err := <-opened; err != nil {
		t.Fatalf("the next guest was refused while the slot was being freed: %v", err)
	}
	done()
}

// TestUnansweredHelloLeavesNothing: a hello whose reply waits for the
// standby (commit mode: the standby must hold the new session first) is
// given up by its guest before it may go (a guest that stops waiting for
// a frozen or deposed primary, or dies mid-hello). Nobody knows of that
// session, so the node frees it at once instead of keeping it for the
// grace period the guest asked for.
func TestUnansweredHelloLeavesNothing(t *testing.T) {
	var holdRecords atomic.Bool
	release := make(chan struct{})
	c, err := cluster.Start(cluster.Options{Replicate: true, Mode: replicate.ModeCommit, StartStandby: true,
		Faults: func(m link.Message) bool {
			if m.From == link.FromPrimary && m.Type == "record" && holdRecords.Load() {
				<-release
			}
			return true
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.WaitProtected(time.Minute); err != nil {
		t.Fatal(err)
	}
	holdRecords.Store(true)
	conn, err := net.Dial("unix", strings.TrimPrefix(c.Endpoint, "unix://"))
	if err != nil {
		t.Fatal(err)
	}
	hello := abi.AppendBodyFrame(nil, abi.OpHello, 0, 1, &abi.Hello{GuestName: "impatient", GraceMS: 60000})
	if _, err := conn.Write(hello); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); len(c.Primary.Status().Sessions) != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the hello opened no session")
		}
	}
	conn.Close() // before the standby holds the session, so before its reply may go
	holdRecords.Store(false)
	close(release)
	for deadline := time.Now().Add(10 * time.Second); len(c.Primary.Status().Sessions) != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("a session nobody was told of is kept (for its 60 s grace): %+v", c.Primary.Status())
		}
	}
}
