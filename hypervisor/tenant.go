package hypervisor

import (
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/mdlayher/vsock"
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
		q, ok := s.cfg.Tenants[id]
		if !ok {
			q = TenantQuota{Memory: s.cfg.TenantMemoryQuota, Sessions: s.cfg.TenantMaxSessions, Detached: s.cfg.TenantMaxDetached}
		}
		t = &tenant{id: id, quota: q}
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

// reserve takes n bytes of the tenant's memory quota; a nil tenant has none.
func (t *tenant) reserve(n uint64) error {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if n > t.quota.Memory-min(t.bytes, t.quota.Memory) {
		return refuse(refusedTenantMemory, abi.StatusOutOfMemory,
			"alloc of %d bytes exceeds the quota of tenant %s (%d of %d bytes in use by its sessions)", n, t.id, t.bytes, t.quota.Memory)
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
	s.metrics.refusals.WithLabelValues(refusedGraceCapped).Inc()
	log("guest asked for a longer grace period than allowed; granted the cap", "asked", asked, "granted", s.cfg.MaxGrace)
	return s.cfg.MaxGrace
}
