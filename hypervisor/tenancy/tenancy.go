// Package tenancy is who a node's guests are and what each may hold: a
// guest is its sessions, but one guest may open many, so quotas also hold
// per tenant, the identity the transport vouches for (never what the guest
// says): a VM's vsock CID, a local process's uid (SO_PEERCRED on the unix
// socket), a remote address for tcp: the IP for IPv4, the /64 prefix for
// IPv6 (a host is routinely given a whole /64, so one host must not be
// 2^64 tenants). Per tenant: the device memory its sessions hold
// together, how many sessions it has open, and how many it may leave
// detached (kept for a resume); and, at its first session, its admission
// to the device.
//
// It owns the tenants present, their quotas, each tenant's memory count
// and the count of the device memory they hold together. It must never
// take a tenant's identity from the guest, never count toward the device
// what a tenant might allocate but has not, and never decide a session's
// life: the server counts sessions in and out (Tenant.Sessions,
// Tenant.Detached).
//
// Admission counts what tenants hold, not what they might hold. A new
// tenant is admitted while the tenants present hold less than the whole
// device; an allocation is refused (refusals{reason="device_full"}) when
// it does not fit beside what every tenant holds, and (tenant_memory)
// when it takes its tenant past its quota. An earlier rule reserved each
// admitted tenant's whole quota while it held a session, which guaranteed
// that quota but let the cheapest thing a guest can do (open a session and
// sit on it, or drop its connection and leave the session in its grace
// period) keep every other tenant off the device: with 4 GiB quotas on an
// 8 GiB device two idle sessions refused everyone. Counting held bytes
// makes keeping others out cost the memory itself, and no tenant can hold
// more than its quota: an idle session holds exactly what it allocated,
// and a session in its grace period (no connection; at most
// --tenant.max-detached per tenant, for at most --guest.max-grace) holds
// its allocations, which its guest's resume needs, and nothing more. The
// price is that no tenant is guaranteed its quota: allocations are first
// come, first served up to each tenant's quota; an operator who wants a
// guarantee gives quotas that sum to at most the device. Config.Overcommit
// leaves the device count out (every tenant admitted, every allocation
// within its quota tried on the device, whose own allocator then refuses).
// A standby's replicas of the primary's sessions are admitted by the
// primary.
//
// Lock order: the server's lock (which guards a Registry and every
// Tenant's Sessions and Detached), then a session's, then Tenant.mu, then
// the device count's lock (leaves, for the memory counts, which
// allocations change under a session's lock alone).
package tenancy

import (
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"

	"github.com/mdlayher/vsock"
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

// Config is the node's tenancy: the default quota, named tenants' own
// (by ID: see Canonical), whether the device's memory is left out of
// admission and allocation, and the device memory tenants hold their
// allocations in (0: unknown, no admission).
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

	device *deviceCount
	mu     sync.Mutex
	bytes  uint64
}

// Registry is the tenants present: those with sessions or memory. The
// server's lock guards it.
type Registry struct {
	cfg     Config
	tenants map[string]*Tenant
	device  *deviceCount
}

// NewRegistry returns an empty registry.
func NewRegistry(cfg Config) *Registry {
	named := make(map[string]Quota, len(cfg.Tenants))
	for id, q := range cfg.Tenants {
		named[Canonical(id)] = q
	}
	cfg.Tenants = named
	return &Registry{cfg: cfg, tenants: map[string]*Tenant{},
		device: &deviceCount{size: cfg.DeviceMemory, overcommit: cfg.Overcommit}}
}

// Of names the tenant on the other end of conn.
func Of(conn net.Conn) string {
	switch a := conn.RemoteAddr().(type) {
	case *vsock.Addr:
		return fmt.Sprintf("cid:%d", a.ContextID)
	case *net.TCPAddr:
		return OfIP(a.IP)
	}
	if _, uid, ok := mmiotrace.PeerCred(conn); ok {
		return fmt.Sprintf("uid:%d", uid)
	}
	return "local:" + conn.RemoteAddr().Network() // an in-process pipe (tests)
}

// ipv6TenantBits is the prefix of an IPv6 address that names its tenant:
// a /64 is one link's, routinely all one host's (SLAAC, privacy
// addresses, a VM's delegated prefix).
const ipv6TenantBits = 64

// OfIP names the tenant of a remote IP: "ip:" and the IPv4 address
// (IPv4-mapped IPv6 ones included), or the IPv6 address's /64 prefix
// ("ip:2001:db8:1:2::/64"; a zone is not part of it).
func OfIP(ip net.IP) string {
	if ip4 := ip.To4(); ip4 != nil {
		return "ip:" + ip4.String()
	}
	if len(ip) != net.IPv6len {
		return "ip:" + ip.String()
	}
	return fmt.Sprintf("ip:%s/%d", ip.Mask(net.CIDRMask(ipv6TenantBits, 8*net.IPv6len)), ipv6TenantBits)
}

// Canonical is the tenant a configured ID names: an "ip:" ID with an IPv6
// address (or any prefix of one, "/64" or not) is its /64 (OfIP); every
// other ID is itself.
func Canonical(id string) string {
	addr, ok := strings.CutPrefix(id, "ip:")
	if !ok {
		return id
	}
	addr, _, _ = strings.Cut(addr, "/")
	ip := net.ParseIP(addr)
	if ip == nil {
		return id
	}
	return OfIP(ip)
}

// Get returns tenant id's entry, creating it; nil for no tenant (a
// replica of a session opened by an older primary).
func (r *Registry) Get(id string) *Tenant {
	if id == "" {
		return nil
	}
	t := r.tenants[id]
	if t == nil {
		t = &Tenant{ID: id, Quota: r.QuotaOf(id), device: r.device}
		r.tenants[id] = t
	}
	return t
}

// Lookup is tenant id's entry if it is present (nil otherwise): unlike
// Get it never adds one.
func (r *Registry) Lookup(id string) *Tenant { return r.tenants[id] }

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

// Admit returns tenant id's entry, admitting it first if it is new: while
// the tenants present hold less than the whole device (or with
// overcommit). What a tenant might allocate is not counted (package doc).
func (r *Registry) Admit(id string) (*Tenant, error) {
	if id == "" || r.tenants[id] != nil || r.device.unlimited() {
		return r.Get(id), nil
	}
	if held, size := r.device.usage(); held >= size {
		return nil, guesterr.Refuse(guesterr.TenantAdmission, abi.StatusOutOfMemory,
			"tenant %s refused at admission: the %d tenants present have allocated all %d bytes of the device's memory "+
				"(--tenant.overcommit admits it anyway)", id, len(r.tenants), size)
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

// TenantStatus is one tenant in /status: what its sessions hold.
type TenantStatus struct {
	Tenant    string `json:"tenant,omitempty"`
	Sessions  int    `json:"sessions"`
	Detached  int    `json:"detached"`
	UsedBytes uint64 `json:"used_bytes"`
}

// Status is the device's memory as its tenants hold it.
type Status struct {
	DeviceMemoryBytes uint64         `json:"device_memory_bytes"`
	UsedBytes         uint64         `json:"used_bytes"`
	Overcommit        bool           `json:"overcommit"`
	Tenants           []TenantStatus `json:"tenants"`
}

// Status reports every tenant present, by id.
func (r *Registry) Status() Status {
	held, _ := r.device.usage()
	ts := Status{DeviceMemoryBytes: r.cfg.DeviceMemory, UsedBytes: held, Overcommit: r.cfg.Overcommit, Tenants: []TenantStatus{}}
	for _, t := range r.tenants {
		t.mu.Lock()
		used := t.bytes
		t.mu.Unlock()
		ts.Tenants = append(ts.Tenants, TenantStatus{Tenant: t.ID, Sessions: t.Sessions, Detached: t.Detached, UsedBytes: used})
	}
	sort.Slice(ts.Tenants, func(i, j int) bool { return ts.Tenants[i].Tenant < ts.Tenants[j].Tenant })
	return ts
}

// Held is the device memory the tenant's sessions hold together; zero for
// a nil tenant.
func (t *Tenant) Held() uint64 {
	if t == nil {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.bytes
}

// Reserve takes n bytes of the tenant's memory quota and of the device's
// memory; a nil tenant has neither.
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
	if held, ok := t.device.take(n); !ok {
		return guesterr.Refuse(guesterr.DeviceFull, abi.StatusOutOfMemory,
			"alloc of %d bytes does not fit in the device's memory: its tenants have allocated %d of its %d bytes", n, held, t.device.size)
	}
	t.bytes += n
	return nil
}

// Release gives n bytes back to the tenant's memory quota and the device.
func (t *Tenant) Release(n uint64) {
	if t == nil {
		return
	}
	t.mu.Lock()
	n = min(n, t.bytes)
	t.bytes -= n
	t.device.give(n)
	t.mu.Unlock()
}

// deviceCount is the device memory every tenant holds together, against
// the device's size; the registry and each of its tenants share it.
type deviceCount struct {
	size       uint64 // 0: unknown
	overcommit bool

	mu   sync.Mutex
	held uint64
}

// unlimited reports whether the device's size is left out of admission
// and allocation.
func (d *deviceCount) unlimited() bool { return d.overcommit || d.size == 0 }

// usage is the bytes held and the device's size.
func (d *deviceCount) usage() (held, size uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.held, d.size
}

// take counts n more bytes held if they fit in the device (always, when
// unlimited); it returns the bytes held before.
func (d *deviceCount) take(n uint64) (held uint64, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	held = d.held
	if !d.unlimited() && n > d.size-min(held, d.size) {
		return held, false
	}
	if held+n < held {
		return held, false
	}
	d.held += n
	return held, true
}

// give counts n bytes no longer held.
func (d *deviceCount) give(n uint64) {
	d.mu.Lock()
	d.held -= min(n, d.held)
	d.mu.Unlock()
}
