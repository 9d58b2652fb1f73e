package hypervisor_test

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// startTCP serves guests over tcp on loopback: there the tenant is the
// guest's IP, and 127.0.0.2 and 127.0.0.3 are two tenants.
func startTCP(t *testing.T, cfg hypervisor.Config) (*env, string) {
	t.Helper()
	e := &env{backend: sim.New(1 << 30), reg: prometheus.NewRegistry()}
	srv, err := hypervisor.NewServer(e.backend, cfg, e.reg, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	e.srv = srv
	return e, ln.Addr().String()
}

func dialFrom(t *testing.T, addr, from string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Skipf("cannot dial from %s (loopback aliases): %v", from, err)
	}
	return conn
}

// tenantGuest opens a session from IP from.
func tenantGuest(t *testing.T, addr, from, name string) (*pvdriver.Client, error) {
	t.Helper()
	c, err := pvdriver.NewClient(dialFrom(t, addr, from), pvdriver.Options{GuestName: name})
	if err == nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}

// TestTenantMemoryQuota: a tenant's sessions share its memory quota: one
// over it is refused (and counted) while another tenant allocates.
func TestTenantMemoryQuota(t *testing.T) {
	cfg := hypervisor.DefaultConfig()
	cfg.MemoryQuota = 48 << 20
	cfg.TenantMemoryQuota = 64 << 20
	e, addr := startTCP(t, cfg)
	a1, err := tenantGuest(t, addr, "127.0.0.2", "a1")
	if err != nil {
		t.Fatal(err)
	}
	a2, err := tenantGuest(t, addr, "127.0.0.2", "a2")
	if err != nil {
		t.Fatal(err)
	}
	b, err := tenantGuest(t, addr, "127.0.0.3", "b")
	if err != nil {
		t.Fatal(err)
	}
	p1, err := a1.Alloc(48 << 20)
	if err != nil {
		t.Fatal(err)
	}
	_, err = a2.Alloc(32 << 20) // within its session's quota, over its tenant's
	var pe *pvdriver.Error
	if !errors.As(err, &pe) || !errors.Is(err, pvdriver.ErrOutOfMemory) || !strings.Contains(pe.Message, "tenant ip:127.0.0.2") {
		t.Fatalf("second session of a tenant over its quota: %v", err)
	}
	if _, err := b.Alloc(48 << 20); err != nil {
		t.Fatalf("another tenant, while the first is at its quota: %v", err)
	}
	if _, err := a2.Alloc(16 << 20); err != nil {
		t.Fatalf("within the tenant's quota: %v", err)
	}
	if refusals(t, e, "tenant_memory") != 1 {
		t.Fatal("refusal not counted")
	}
	if err := a1.Free(p1); err != nil {
		t.Fatal(err)
	}
	if _, err := a2.Alloc(32 << 20); err != nil {
		t.Fatalf("after the tenant freed memory: %v", err)
	}
	a2.Close()
	deadline := time.Now().Add(5 * time.Second)
	for len(e.srv.Status().Sessions) != 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := a1.Alloc(48 << 20); err != nil {
		t.Fatalf("after the tenant's other session closed: %v", err)
	}
}

// TestTenantSessionLimit: a tenant over its session limit is refused while
// another opens sessions; Tenants overrides the default for one tenant.
func TestTenantSessionLimit(t *testing.T) {
	cfg := hypervisor.DefaultConfig()
	cfg.TenantMaxSessions = 2
	cfg.Tenants = map[string]hypervisor.TenantQuota{"ip:127.0.0.3": {Memory: 1 << 30, Sessions: 3}}
	e, addr := startTCP(t, cfg)
	for i := 0; i < 2; i++ {
		if _, err := tenantGuest(t, addr, "127.0.0.2", "a"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tenantGuest(t, addr, "127.0.0.2", "a"); !errors.Is(err, pvdriver.ErrOutOfMemory) {
		t.Fatalf("third session of a tenant limited to two: %v", err)
	}
	for i := 0; i < 3; i++ {
		if _, err := tenantGuest(t, addr, "127.0.0.3", "b"); err != nil {
			t.Fatalf("session %d of a tenant allowed three: %v", i, err)
		}
	}
	if refusals(t, e, "tenant_sessions") != 1 {
		t.Fatal("refusal not counted")
	}
}

// TestGraceCapped: a guest asking to keep its session 49 days after its
// connection drops gets the node's cap; the session is freed then.
func TestGraceCapped(t *testing.T) {
	cfg := hypervisor.DefaultConfig()
	cfg.MaxGrace = 200 * time.Millisecond
	e := start(t, cfg)
	r := dialRaw(t, e)
	const days49 = 49 * 24 * 3600 * 1000
	if st, msg := r.send(abi.OpHello, 0, 1, &abi.Hello{GuestName: "squatter", GraceMS: days49}, &abi.HelloReply{}); st != abi.StatusOK {
		t.Fatal(msg)
	}
	r.conn.Close()
	deadline := time.Now().Add(5 * time.Second)
	for len(e.srv.Status().Sessions) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("session kept past the grace cap")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if refusals(t, e, "grace_capped") != 1 {
		t.Fatal("capped grace not counted")
	}
}

// TestTenantDetachedLimit: a tenant may leave only so many sessions
// detached; the connection loss of one more frees it at once.
func TestTenantDetachedLimit(t *testing.T) {
	cfg := hypervisor.DefaultConfig()
	cfg.TenantMaxDetached = 2
	e := start(t, cfg)
	for i := uint64(1); i <= 3; i++ {
		r := dialRaw(t, e)
		if st, msg := r.send(abi.OpHello, 0, 1, &abi.Hello{GuestName: "g", GraceMS: 60000}, &abi.HelloReply{}); st != abi.StatusOK {
			t.Fatal(msg)
		}
		r.conn.Close()
		deadline := time.Now().Add(5 * time.Second)
		for e.srv.Status().Detached < int(min(i, 2)) || counter(t, e, "vgpuha_guest_refusals_total", map[string]string{"reason": "tenant_detached"}) < float64(i)-2 {
			if time.Now().After(deadline) {
				t.Fatalf("after %d dropped connections: %+v", i, e.srv.Status())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if st := e.srv.Status(); len(st.Sessions) != 2 || st.Detached != 2 {
		t.Fatalf("%d sessions, %d detached; want 2 and 2", len(st.Sessions), st.Detached)
	}
	served(t, e.client(t, "fresh"), "the tenant's new session")
}

// startTCPDevice is startTCP on a software GPU of mem bytes.
func startTCPDevice(t *testing.T, cfg hypervisor.Config, mem uint64) (*env, string) {
	t.Helper()
	e := &env{backend: sim.New(mem), reg: prometheus.NewRegistry()}
	srv, err := hypervisor.NewServer(e.backend, cfg, e.reg, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	e.srv = srv
	return e, ln.Addr().String()
}

// TestTenantAdmission: admission counts what tenants hold. Two tenants
// with 4 GiB quotas on a 6 GiB device are both admitted; once they hold
// the whole device an allocation that does not fit is refused
// (device_full) and a third tenant is refused at admission (shown in the
// status with what each holds) until one frees memory; with overcommit the
// device's own allocator refuses, and the first tenant keeps every byte
// it allocated.
func TestTenantAdmission(t *testing.T) {
	cfg := hypervisor.DefaultConfig()
	cfg.MemoryQuota, cfg.TenantMemoryQuota = 4<<30, 4<<30
	e, addr := startTCPDevice(t, cfg, 6<<30)
	a, err := tenantGuest(t, addr, "127.0.0.2", "a")
	if err != nil {
		t.Fatal(err)
	}
	pa, err := a.Alloc(4 << 30)
	if err != nil {
		t.Fatal(err)
	}
	b, err := tenantGuest(t, addr, "127.0.0.3", "b")
	if err != nil {
		t.Fatalf("a second 4 GiB tenant on a 6 GiB device of which 4 GiB are held: %v; want it admitted", err)
	}
	if _, err := b.Alloc(2 << 30); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Alloc(2 << 20); !errors.Is(err, pvdriver.ErrOutOfMemory) || !strings.Contains(err.Error(), "does not fit in the device's memory") {
		t.Fatalf("an allocation past the device's memory: %v; want a refusal", err)
	}
	_, err = tenantGuest(t, addr, "127.0.0.4", "c")
	if err == nil || !errors.Is(err, abi.StatusOutOfMemory) || !strings.Contains(err.Error(), "refused at admission") {
		t.Fatalf("a third tenant while the device is all held: %v; want a refusal at admission", err)
	}
	if refusals(t, e, "tenant_admission") != 1 || refusals(t, e, "device_full") != 1 {
		t.Error("the refusals were not counted")
	}
	ten := e.srv.Status().Tenancy
	if ten.DeviceMemoryBytes != 6<<30 || ten.UsedBytes != 6<<30 || len(ten.Tenants) != 2 ||
		ten.Tenants[0] != (hypervisor.TenantStatus{Tenant: "ip:127.0.0.2", Sessions: 1, UsedBytes: 4 << 30}) ||
		ten.Tenants[1] != (hypervisor.TenantStatus{Tenant: "ip:127.0.0.3", Sessions: 1, UsedBytes: 2 << 30}) {
		t.Errorf("tenancy status: %+v", ten)
	}
	if red := e.srv.Status().Redacted().Tenancy.Tenants; len(red) != 2 || red[0].Tenant != "" || red[1].Tenant != "" {
		t.Errorf("redacted tenancy names its tenants: %+v", red)
	}
	if err := a.Free(pa); err != nil {
		t.Fatal(err)
	}
	if _, err := tenantGuest(t, addr, "127.0.0.4", "c"); err != nil {
		t.Fatalf("a third tenant once the first freed its memory: %v", err)
	}

	cfg.TenantOvercommit = true
	_, addr = startTCPDevice(t, cfg, 6<<30)
	a, err = tenantGuest(t, addr, "127.0.0.2", "a")
	if err != nil {
		t.Fatal(err)
	}
	b, err = tenantGuest(t, addr, "127.0.0.3", "b")
	if err != nil {
		t.Fatalf("overcommit: the second tenant was refused: %v", err)
	}
	p, err := a.Alloc(4 << 30)
	if err != nil {
		t.Fatal(err)
	}
	pattern := []byte("the first tenant's bytes")
	if err := a.CopyHtoD(p+(4<<30)-pvdriver.DevicePtr(len(pattern)), pattern); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Alloc(4 << 30); err == nil {
		t.Fatal("overcommit: 8 GiB allocated on a 6 GiB device")
	}
	got := make([]byte, len(pattern))
	if err := a.CopyDtoH(got, p+(4<<30)-pvdriver.DevicePtr(len(pattern))); err != nil || string(got) != string(pattern) {
		t.Fatalf("the first tenant lost its allocation: %q, %v", got, err)
	}
}

// TestIdleSessionLeavesRoom: with the default quotas (4 GiB a tenant) on
// an 8 GiB device, a working tenant and an idle session of another tenant
// keep no third tenant out (they filled admission when it counted quotas):
// the third is admitted and allocates what the other two do not hold.
func TestIdleSessionLeavesRoom(t *testing.T) {
	e, addr := startTCPDevice(t, hypervisor.DefaultConfig(), 8<<30)
	victim, err := tenantGuest(t, addr, "127.0.0.2", "victim")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := victim.Alloc(1 << 30); err != nil {
		t.Fatal(err)
	}
	if _, err := tenantGuest(t, addr, "127.0.0.3", "idle"); err != nil {
		t.Fatal(err)
	}
	for i, from := range []string{"127.0.0.4", "127.0.0.5"} {
		c, err := tenantGuest(t, addr, from, "newcomer")
		if err != nil {
			t.Fatalf("tenant %s beside a working tenant and an idle session: %v", from, err)
		}
		if _, err := c.Alloc(3 << 30); err != nil {
			t.Fatalf("newcomer %d: %v", i, err)
		}
	}
	if n := refusals(t, e, "tenant_admission"); n != 0 {
		t.Errorf("%v refusals at admission", n)
	}
	served(t, victim, "the working tenant")
}

// TestGraceSessionHoldsOnlyItsBytes: a session whose connection dropped,
// kept for its 120 s grace period, holds what it allocated and nothing
// more: two other tenants are admitted and allocate the rest of the
// device; the expired session gives its bytes back.
func TestGraceSessionHoldsOnlyItsBytes(t *testing.T) {
	clock := newFakeClock()
	cfg := hypervisor.DefaultConfig()
	cfg.Clock = clock.Now
	e, addr := startTCPDevice(t, cfg, 8<<30)
	conn := dialFrom(t, addr, "127.0.0.3")
	r := &raw{t: t, conn: conn, fr: abi.NewFrameReader(conn, 1<<20)}
	var hello abi.HelloReply
	if st, msg := r.send(abi.OpHello, 0, 1, &abi.Hello{GuestName: "dropped", GraceMS: 120000}, &hello); st != abi.StatusOK {
		t.Fatal(msg)
	}
	if st, msg := r.send(abi.OpAlloc, 0, 1, &abi.Alloc{Size: 512 << 20}, &abi.AllocReply{}); st != abi.StatusOK {
		t.Fatal(msg)
	}
	conn.Close()
	waitSessionDetached(t, e.srv, hello.Session)
	if ten := e.srv.Status().Tenancy; ten.UsedBytes != 512<<20 || len(ten.Tenants) != 1 ||
		ten.Tenants[0] != (hypervisor.TenantStatus{Tenant: "ip:127.0.0.3", Sessions: 1, Detached: 1, UsedBytes: 512 << 20}) {
		t.Fatalf("tenancy with one session in its grace period: %+v", ten)
	}
	a, err := tenantGuest(t, addr, "127.0.0.2", "a")
	if err != nil {
		t.Fatal(err)
	}
	c, err := tenantGuest(t, addr, "127.0.0.4", "c")
	if err != nil {
		t.Fatalf("a tenant beside another one and a session in its grace period: %v", err)
	}
	if _, err := a.Alloc(4 << 30); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Alloc(3<<30 + 512<<20); err != nil {
		t.Fatalf("the device's memory less the grace session's 512 MiB: %v", err)
	}
	if _, err := c.Alloc(2 << 20); !errors.Is(err, pvdriver.ErrOutOfMemory) {
		t.Fatalf("past the device with the grace session's 512 MiB held: %v", err)
	}
	clock.advance(2 * time.Minute)
	e.srv.ExpireDetached()
	if _, ok := sessionByID(e.srv, hello.Session); ok {
		t.Fatal("the session outlived its grace period")
	}
	if _, err := c.Alloc(512 << 20); err != nil {
		t.Fatalf("the expired session's bytes were not given back: %v", err)
	}
}

// ipv6Conn is a guest connection that comes from an IPv6 address.
type ipv6Conn struct {
	net.Conn
	from *net.TCPAddr
}

func (c ipv6Conn) RemoteAddr() net.Addr { return c.from }

// TestIPv6TenantIsItsPrefix: guests from two addresses of one IPv6 /64 are
// one tenant (its session limit holds for both); another /64 is another
// tenant, and a quota named by any address of a /64 is that /64's.
func TestIPv6TenantIsItsPrefix(t *testing.T) {
	cfg := hypervisor.DefaultConfig()
	cfg.TenantMaxSessions = 1
	cfg.Tenants = map[string]hypervisor.TenantQuota{"ip:2001:db8:1:3::77": {Memory: 1 << 30, Sessions: 2, Detached: 1}}
	e := start(t, cfg)
	from := func(addr string) (*pvdriver.Client, error) {
		guestEnd, nodeEnd := net.Pipe()
		go e.srv.ServeConn(ipv6Conn{nodeEnd, &net.TCPAddr{IP: net.ParseIP(addr), Port: 40000}})
		c, err := pvdriver.NewClient(guestEnd, pvdriver.Options{GuestName: addr})
		if err == nil {
			t.Cleanup(func() { c.Close() })
		} else {
			guestEnd.Close()
		}
		return c, err
	}
	if _, err := from("2001:db8:1:2::1"); err != nil {
		t.Fatal(err)
	}
	if _, err := from("2001:db8:1:2:9f3c:11ff:fe00:42"); !errors.Is(err, pvdriver.ErrOutOfMemory) {
		t.Fatalf("a second address of the same /64, its tenant limited to one session: %v", err)
	}
	for _, addr := range []string{"2001:db8:1:3::1", "2001:db8:1:3:ffff::2"} {
		if _, err := from(addr); err != nil {
			t.Fatalf("%s, of a /64 allowed two sessions: %v", addr, err)
		}
	}
	if refusals(t, e, "tenant_sessions") != 1 {
		t.Error("refusal not counted")
	}
	var ids []string
	for _, ten := range e.srv.Status().Tenancy.Tenants {
		ids = append(ids, fmt.Sprintf("%s=%d", ten.Tenant, ten.Sessions))
	}
	if got := strings.Join(ids, " "); got != "ip:2001:db8:1:2::/64=1 ip:2001:db8:1:3::/64=2" {
		t.Errorf("tenants %s", got)
	}
	cfg.Tenants["ip:2001:db8:1:3::/64"] = hypervisor.TenantQuota{Memory: 1, Sessions: 1}
	if _, err := hypervisor.NewServer(sim.New(1<<20), cfg, prometheus.NewRegistry(), quietLog()); err == nil || !strings.Contains(err.Error(), "one tenant") {
		t.Errorf("two quotas for one /64: %v", err)
	}
}
