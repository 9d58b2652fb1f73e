// Package tenancy is who a node's guests are and what each may hold: a
// guest is its sessions, but one guest may open many, so quotas also hold
// per tenant, the identity the transport vouches for (never what the guest
// says): a VM's vsock CID, a local process's uid (SO_PEERCRED on the unix
// socket), a remote IP for tcp. Per tenant: the device memory its
// sessions hold together, how many sessions it has open, and how many it
// may leave detached (kept for a resume); and, at its first session, its
// admission to the device.
//
// It owns the tenants present, their quotas and reservations, and each
// tenant's memory count. It must never take a tenant's identity from the
// guest, and never decide a session's life: the server counts sessions in
// and out (Tenant.Sessions, Tenant.Detached).
//
// Lock order: the server's lock (which guards a Registry and every
// Tenant's Sessions and Detached), then a session's, then Tenant.mu (a
// leaf, for the memory count, which allocations change under a session's
// lock alone).
package tenancy

import (
	"fmt"
	"net"
	"sort"
	"sync"

	"github.com/mdlayher/vsock"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/internal/guesterr"
	"github.com/vgpuha/vgpuha/mmiotrace"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Quota bounds one tenant.
type Quota struct {
	// Memory bounds the device memory all its sessions hold together.
	Memory uint64
	// Sessions bounds its open sessions; Detached those kept for a resume.
	Sessions, Detached int
}

// Config is the node's tenancy: the default quota, named tenants' own,
// whether every tenant is admitted, and the device memory reservations
// are made from (0: no admission).
type Config struct {
	Default      Quota
	Tenants      map[string]Quota
	Overcommit   bool
	DeviceMemory uint64
}

// Tenant is one tenant present on the node.
type Tenant struct {
	ID    string
	Quota Quota
	// Sessions and Detached are guarded by the server's lock.
	Sessions, Detached int

	mu    sync.Mutex
	bytes uint64
}

// Registry is the tenants present: those with sessions or memory. The
// server's lock guards it.
type Registry struct {
	cfg     Config
	tenants map[string]*Tenant
}

// NewRegistry returns an empty registry.
func NewRegistry(cfg Config) *Registry {
	return &Registry{cfg: cfg, tenants: map[string]*Tenant{}}
}

// Of names the tenant on the other end of conn.
func Of(conn net.Conn) string {
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

// Get returns tenant id's entry, creating it; nil for no tenant (a
// replica of a session opened by an older primary).
func (r *Registry) Get(id string) *Tenant {
	if id == "" {
		return nil
	}
	t := r.tenants[id]
	if t == nil {
		t = &Tenant{ID: id, Quota: r.QuotaOf(id)}
		r.tenants[id] = t
	}
	return t
}

// Drop forgets a tenant that holds nothing.
func (r *Registry) Drop(t *Tenant) {
	if t == nil || t.Sessions > 0 {
		return
	}
	t.mu.Lock()
	empty := t.bytes == 0
	t.mu.Unlock()
	if empty {
		delete(r.tenants, t.ID)
	}
}

// Admission: a tenant's memory quota is also what the device reserves
// for it while it holds a session or memory, so that an operator can
// guarantee every admitted tenant its whole quota. A new tenant whose
// reservation no longer fits in the device's memory beside the others'
// is refused at its first hello (refusals{reason="tenant_admission"}),
// unless Config.Overcommit admits it anyway; then allocations are first
// come, first served, and a device that runs out refuses the next
// allocation, never taking back one made. A reservation is the quota, or
// the whole device where the quota is larger (one tenant is always
// admitted). A standby's replicas of the primary's sessions are admitted
// by the primary.

// DeviceMemory is the device memory admission shares out: configured, or
// the backend's (gpu.DeviceDescriber); 0 where unknown (no admission).
func DeviceMemory(backend gpu.Backend, configured uint64) uint64 {
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
func (r *Registry) reservation(q Quota) uint64 {
	if r.cfg.DeviceMemory == 0 {
		return q.Memory
	}
	return min(q.Memory, r.cfg.DeviceMemory)
}

// reserved sums the reservations of the tenants present.
func (r *Registry) reserved() uint64 {
	var sum uint64
	for _, t := range r.tenants {
		sum += r.reservation(t.Quota)
	}
	return sum
}

// Admit returns tenant id's entry, admitting it first if it is new and its
// reservation fits beside the others' (or overcommit is set).
func (r *Registry) Admit(id string) (*Tenant, error) {
	if id == "" || r.tenants[id] != nil || r.cfg.Overcommit || r.cfg.DeviceMemory == 0 {
		return r.Get(id), nil
	}
	q := r.QuotaOf(id)
	reserved, want := r.reserved(), r.reservation(q)
	if reserved+want > r.cfg.DeviceMemory || reserved+want < reserved {
		return nil, guesterr.Refuse(guesterr.TenantAdmission, abi.StatusOutOfMemory,
			"tenant %s refused at admission: its quota of %d bytes does not fit in the device's %d bytes beside the %d reserved for %d other tenants "+
				"(each is guaranteed its quota; --tenant.overcommit admits it anyway)", id, want, r.cfg.DeviceMemory, reserved, len(r.tenants))
	}
	return r.Get(id), nil
}

// QuotaOf is tenant id's quota: its own, or the default.
func (r *Registry) QuotaOf(id string) Quota {
	if q, ok := r.cfg.Tenants[id]; ok {
		return q
	}
	return r.cfg.Default
}

// TenantStatus is one tenant in /status: what the device reserves for it
// and what its sessions hold.
type TenantStatus struct {
	Tenant        string `json:"tenant,omitempty"`
	Sessions      int    `json:"sessions"`
	ReservedBytes uint64 `json:"reserved_bytes"`
	UsedBytes     uint64 `json:"used_bytes"`
}

// Status is the device's share-out among tenants.
type Status struct {
	DeviceMemoryBytes uint64         `json:"device_memory_bytes"`
	ReservedBytes     uint64         `json:"reserved_bytes"`
	Overcommit        bool           `json:"overcommit"`
	Tenants           []TenantStatus `json:"tenants"`
}

// Status reports every tenant present, by id.
func (r *Registry) Status() Status {
	ts := Status{DeviceMemoryBytes: r.cfg.DeviceMemory, Overcommit: r.cfg.Overcommit, Tenants: []TenantStatus{}}
	for _, t := range r.tenants {
		t.mu.Lock()
		used := t.bytes
		t.mu.Unlock()
		res := r.reservation(t.Quota)
		ts.ReservedBytes += res
		ts.Tenants = append(ts.Tenants, TenantStatus{Tenant: t.ID, Sessions: t.Sessions, ReservedBytes: res, UsedBytes: used})
	}
	sort.Slice(ts.Tenants, func(i, j int) bool { return ts.Tenants[i].Tenant < ts.Tenants[j].Tenant })
	return ts
}

// Reserve takes n bytes of the tenant's memory quota; a nil tenant has none.
func (t *Tenant) Reserve(n uint64) error {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if n > t.Quota.Memory-min(t.bytes, t.Quota.Memory) {
		return guesterr.Refuse(guesterr.TenantMemory, abi.StatusOutOfMemory,
			"alloc of %d bytes exceeds the quota of tenant %s (%d of %d bytes in use by its sessions; --tenant.memory-quota-bytes)", n, t.ID, t.bytes, t.Quota.Memory)
	}
	t.bytes += n
	return nil
}

// Release gives n bytes back to the tenant's memory quota.
func (t *Tenant) Release(n uint64) {
	if t == nil {
		return
	}
	t.mu.Lock()
	t.bytes -= min(n, t.bytes)
	t.mu.Unlock()
}
