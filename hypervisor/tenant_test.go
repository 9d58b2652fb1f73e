package hypervisor_test

import (
	"errors"
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
	cfg.TenantOvercommit = true // two tenants with the whole 1 GiB device each
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

// TestTenantAdmission: two tenants with 4 GiB quotas on a 6 GiB device:
// the second is refused at admission (counted, and shown in the status
// with what the first reserves and uses); with overcommit both are
// admitted, the device runs out for the second, and the first keeps every
// byte it allocated.
func TestTenantAdmission(t *testing.T) {
	cfg := hypervisor.DefaultConfig()
	cfg.MemoryQuota, cfg.TenantMemoryQuota = 4<<30, 4<<30
	e, addr := startTCPDevice(t, cfg, 6<<30)
	a, err := tenantGuest(t, addr, "127.0.0.2", "a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Alloc(1 << 30); err != nil {
		t.Fatal(err)
	}
	_, err = tenantGuest(t, addr, "127.0.0.3", "b")
	if err == nil || !errors.Is(err, abi.StatusOutOfMemory) || !strings.Contains(err.Error(), "refused at admission") {
		t.Fatalf("a second 4 GiB tenant on a 6 GiB device: %v; want a refusal at admission", err)
	}
	if refusals(t, e, "tenant_admission") != 1 {
		t.Error("the refusal was not counted")
	}
	ten := e.srv.Status().Tenancy
	if ten.DeviceMemoryBytes != 6<<30 || ten.ReservedBytes != 4<<30 || len(ten.Tenants) != 1 ||
		ten.Tenants[0] != (hypervisor.TenantStatus{Tenant: "ip:127.0.0.2", Sessions: 1, ReservedBytes: 4 << 30, UsedBytes: 1 << 30}) {
		t.Errorf("tenancy status: %+v", ten)
	}
	if red := e.srv.Status().Redacted().Tenancy.Tenants; len(red) != 1 || red[0].Tenant != "" {
		t.Errorf("redacted tenancy names its tenants: %+v", red)
	}

	cfg.TenantOvercommit = true
	_, addr = startTCPDevice(t, cfg, 6<<30)
	a, err = tenantGuest(t, addr, "127.0.0.2", "a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := tenantGuest(t, addr, "127.0.0.3", "b")
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
