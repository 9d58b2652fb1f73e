package hypervisor

import (
	"fmt"
	"github.com/vgpuha/vgpuha/hypervisor/internal/guesterr"
	"net"
	"sort"
	"sync"
	"time"

	"github.com/mdlayher/vsock"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/mmiotrace"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Tenancy: a guest is its sessions, but one guest may open many. Quotas
// therefore also hold per tenant, the identity the transport vouches for
// (never what the guest says): a VM's vsock CID, a local process's uid
// (SO_PEERCRED on the unix socket), a remote IP for tcp. Per tenant: the
// device memory its sessions hold together, how many sessions it has open,
// and how many it may leave detached (kept for a resume). A guest's grace
// period is capped for everyone.
//
// Lock order: Server.mu, then Session.mu, then tenant.mu (a leaf, for the
// memory count, which allocations change under Session.mu alone).

// TenantQuota bounds one tenant.
type TenantQuota struct {
	// Memory bounds the device memory all its sessions hold together.
	Memory uint64
	// Sessions bounds its open sessions; Detached those kept for a resume.
	Sessions, Detached int
}

type tenant struct {
	id    string
	quota TenantQuota
	// sessions and detached are guarded by Server.mu.
	sessions, detached int

	mu    sync.Mutex
	bytes uint64
}

// tenantOf names the tenant on the other end of conn.
func tenantOf(conn net.Conn) string {
	switch a := conn.RemoteAddr().(type) {
	case *vsock.Addr:
		return fmt.Sprintf("cid:%d", a.ContextID)
	case *net.TCPAddr:
		return "ip:" + a.IP.String()
	}
	if _, uid, ok := mmiotrace.PeerCred(conn); ok {
		return fmt.Sprintf("uid:%d", uid)
	}
	return "local:" + conn.RemoteAddr().Network() // an in-process pipe (tests)
}

// tenantLocked returns tenant id's entry, creating it.
// Precondition: s.mu must be locked.
func (s *Server) tenantLocked(id string) *tenant {
	if id == "" {
		return nil // a replica of a session opened by an older primary
	}
	t := s.tenants[id]
	if t == nil {
		t = &tenant{id: id, quota: s.quotaOf(id)}
		s.tenants[id] = t
	}
	return t
}

// dropTenantLocked forgets a tenant that holds nothing.
// Precondition: s.mu must be locked.
func (s *Server) dropTenantLocked(t *tenant) {
	if t == nil || t.sessions > 0 {
		return
	}
	t.mu.Lock()
	empty := t.bytes == 0
	t.mu.Unlock()
	if empty {
		delete(s.tenants, t.id)
	}
}

// Admission: a tenant's memory quota is also what the device reserves
// for it while it holds a session or memory, so that an operator can
// guarantee every admitted tenant its whole quota. A new tenant whose
// reservation no longer fits in the device's memory beside the others'
// is refused at its first hello (refusals{reason="tenant_admission"}),
// unless Config.TenantOvercommit admits it anyway; then allocations are
// first come, first served, and a device that runs out refuses the next
// allocation, never taking back one made. A reservation is the quota, or
// the whole device where the quota is larger (one tenant is always
// admitted). A standby's replicas of the primary's sessions are admitted
// by the primary.

// deviceMemory is the device memory admission shares out: configured, or
// the backend's (gpu.DeviceDescriber); 0 where unknown (no admission).
func deviceMemory(backend gpu.Backend, configured uint64) uint64 {
	if configured > 0 {
		return configured
	}
	if d, ok := backend.(gpu.DeviceDescriber); ok {
		if info, err := d.DeviceInfo(); err == nil {
			return info.TotalMem
		}
	}
	return 0
}

// reservation is what the device keeps for a tenant with quota q.
func (s *Server) reservation(q TenantQuota) uint64 {
	if s.cfg.DeviceMemory == 0 {
		return q.Memory
	}
	return min(q.Memory, s.cfg.DeviceMemory)
}

// reservedLocked sums the reservations of the tenants present.
// Precondition: s.mu must be locked.
func (s *Server) reservedLocked() uint64 {
	var sum uint64
	for _, t := range s.tenants {
		sum += s.reservation(t.quota)
	}
	return sum
}

// admitLocked returns tenant id's entry, admitting it first if it is new
// and its reservation fits beside the others' (or overcommit is set).
// Precondition: s.mu must be locked.
func (s *Server) admitLocked(id string) (*tenant, error) {
	if id == "" || s.tenants[id] != nil || s.cfg.TenantOvercommit || s.cfg.DeviceMemory == 0 {
		return s.tenantLocked(id), nil
	}
	q := s.quotaOf(id)
	reserved, want := s.reservedLocked(), s.reservation(q)
	if reserved+want > s.cfg.DeviceMemory || reserved+want < reserved {
		return nil, refuse(guesterr.TenantAdmission, abi.StatusOutOfMemory,
			"tenant %s refused at admission: its quota of %d bytes does not fit in the device's %d bytes beside the %d reserved for %d other tenants "+
				"(each is guaranteed its quota; --tenant.overcommit admits it anyway)", id, want, s.cfg.DeviceMemory, reserved, len(s.tenants))
	}
	return s.tenantLocked(id), nil
}

// quotaOf is tenant id's quota: its own, or the default.
func (s *Server) quotaOf(id string) TenantQuota {
	if q, ok := s.cfg.Tenants[id]; ok {
		return q
	}
	return TenantQuota{Memory: s.cfg.TenantMemoryQuota, Sessions: s.cfg.TenantMaxSessions, Detached: s.cfg.TenantMaxDetached}
}

// TenantStatus is one tenant in /status: what the device reserves for it
// and what its sessions hold.
type TenantStatus struct {
	Tenant        string `json:"tenant,omitempty"`
	Sessions      int    `json:"sessions"`
	ReservedBytes uint64 `json:"reserved_bytes"`
	UsedBytes     uint64 `json:"used_bytes"`
}

// TenancyStatus is the device's share-out among tenants.
type TenancyStatus struct {
	DeviceMemoryBytes uint64         `json:"device_memory_bytes"`
	ReservedBytes     uint64         `json:"reserved_bytes"`
	Overcommit        bool           `json:"overcommit"`
	Tenants           []TenantStatus `json:"tenants"`
}

// tenancy reports every tenant present, by id.
func (s *Server) tenancy() TenancyStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	ts := TenancyStatus{DeviceMemoryBytes: s.cfg.DeviceMemory, Overcommit: s.cfg.TenantOvercommit, Tenants: []TenantStatus{}}
	for _, t := range s.tenants {
		t.mu.Lock()
		used := t.bytes
		t.mu.Unlock()
		r := s.reservation(t.quota)
		ts.ReservedBytes += r
		ts.Tenants = append(ts.Tenants, TenantStatus{Tenant: t.id, Sessions: t.sessions, ReservedBytes: r, UsedBytes: used})
	}
	sort.Slice(ts.Tenants, func(i, j int) bool { return ts.Tenants[i].Tenant < ts.Tenants[j].Tenant })
	return ts
}

// reserve takes n bytes of the tenant's memory quota; a nil tenant has none.
func (t *tenant) reserve(n uint64) error {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if n > t.quota.Memory-min(t.bytes, t.quota.Memory) {
		return refuse(guesterr.TenantMemory, abi.StatusOutOfMemory,
			"alloc of %d bytes exceeds the quota of tenant %s (%d of %d bytes in use by its sessions; --tenant.memory-quota-bytes)", n, t.id, t.bytes, t.quota.Memory)
	}
	t.bytes += n
	return nil
}

func (t *tenant) release(n uint64) {
	if t == nil {
		return
	}
	t.mu.Lock()
	t.bytes -= min(n, t.bytes)
	t.mu.Unlock()
}

// grace caps the grace period a guest asked for.
func (s *Server) grace(ms uint32, log func(string, ...any)) time.Duration {
	asked := time.Duration(ms) * time.Millisecond
	if asked <= s.cfg.MaxGrace {
		return asked
	}
	s.metrics.refusals.WithLabelValues(guesterr.GraceCapped).Inc()
	log("guest asked for a longer grace period than allowed; granted the cap", "asked", asked, "granted", s.cfg.MaxGrace)
	return s.cfg.MaxGrace
}
