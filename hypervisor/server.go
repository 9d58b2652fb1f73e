// Package hypervisor is the primary's backend for guest GPU calls: it keeps
// one Session per guest, validates every request against that guest's own
// allocations and handles, and executes it on a gpu.Backend.
//
// It owns the server (sessions and their lifetimes, lifetime.go: the
// serving node's clock frees a session no guest resumes within its grace
// period, and a node that begins to serve adopts the sessions no
// connection serves; the guest windows' slots), the handler table
// (opTable: one handler per row of abi's opcode table, which says what
// each opcode is), what a guest learns of the device, in a session or on
// a status connection that holds none (status.go), where a copy's bytes
// are read (inplace.go), and the primary's replication hooks (replication.go, resync.go, readback.go; a
// request that fails is answered on both nodes: failures.go).
// Its rooms own the rest, each behind a small interface of its own: the
// connection edge (package guestconn), a session's device memory (devmem),
// objects (objects), apertures (aperture) and exactly-once table
// (exactlyonce), the replica side (replica), tenants (tenancy) and module
// images (images).
// It must never: trust a byte a guest sends (package abi decodes), log as a
// read-back bytes a guest could change after the device returned them
// (readback.go), let one guest name another's memory or handles, let a
// guest's misbehaviour (garbage, a cut connection, a flood, replies it
// never reads) affect any other session, or let a request that failed be
// applied after a failover (failures.go).
//
// One goroutine serves each connection and runs its requests in order. The
// per-session mutex serialises those requests with everything else that
// touches the session: status readers, the aperture flush timer, a
// snapshot or switchover stopping every session (stopTheWorld), a
// replica's applier, and fencing.
package hypervisor

import (
	"errors"
	"fmt"
	"github.com/vgpuha/vgpuha/hypervisor/aperture"
	"github.com/vgpuha/vgpuha/hypervisor/devmem"
	"github.com/vgpuha/vgpuha/hypervisor/guestconn"
	"github.com/vgpuha/vgpuha/hypervisor/images"
	"github.com/vgpuha/vgpuha/hypervisor/internal/guesterr"
	"github.com/vgpuha/vgpuha/hypervisor/objects"
	"github.com/vgpuha/vgpuha/hypervisor/placement"
	"github.com/vgpuha/vgpuha/hypervisor/tenancy"
	"log/slog"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/mmiotrace"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
)

// Config bounds what guests may do.
type Config struct {
	// WindowBase is where the first session's device-address window starts;
	// session slot i gets WindowBase + i*WindowSize.
	WindowBase uint64
	// WindowSize is each session's device-address window.
	WindowSize uint64
	// AllocAlign aligns every allocation (2 MiB, the CUDA VMM granularity, so
	// a CUDA standby can map at the same offsets).
	AllocAlign uint64
	// MaxSessions bounds concurrent guests.
	MaxSessions int
	// MaxStatusConns bounds the status connections open at once (guests'
	// NVML watching the device without a session: status.go); they are
	// not sessions and do not count against MaxSessions.
	MaxStatusConns int
	// GuestKernels lets guests load kernels that are not the library's own
	// (their own PTX or images). Such a kernel can read and write any memory
	// of its process's GPU contexts, so it needs MaxSessions == 1 (one
	// guest per primary process) unless the backend runs every context in
	// a process of its own (gpu.ProcessIsolator: GPU workers).
	GuestKernels bool
	// MemoryQuota bounds each session's allocated bytes.
	MemoryQuota uint64
	// Placement is the policy that places each new session on one of the
	// node's GPUs (package placement; empty: placement.DefaultPolicy).
	Placement placement.Policy
	// MaxObjects bounds each session's allocations plus handles.
	MaxObjects int
	// MaxPayload bounds a frame's payload (after hello; before it, a
	// connection may send 4 KiB).
	MaxPayload int
	// RequestBufferBytes bounds the request bytes buffered by all guest
	// connections together (package guestconn).
	RequestBufferBytes int64
	// ReplyQueueBytes bounds the reply bytes one guest connection holds
	// queued for its guest: past it the node reads none of that
	// connection's requests until the guest reads replies. WriteTimeout
	// drops a connection whose guest reads nothing of its replies for that
	// long (its session is kept for its grace period). Package guestconn.
	ReplyQueueBytes int64
	WriteTimeout    time.Duration
	// Per tenant (package tenancy): the device memory its sessions hold
	// together, its open sessions, and those it may leave detached;
	// Tenants overrides them for named tenants ("uid:1000", "cid:3",
	// "ip:10.0.0.5", "ip:2001:db8:1:2::/64": an IPv6 tenant is its /64).
	TenantMemoryQuota uint64
	TenantMaxSessions int
	TenantMaxDetached int
	Tenants           map[string]TenantQuota
	// TenantOvercommit leaves DeviceMemory out of admission and
	// allocation; without it a new tenant is refused while the tenants
	// present have allocated all of it, and an allocation that does not
	// fit beside theirs is refused (package tenancy).
	TenantOvercommit bool
	// DeviceMemory is the device memory tenants hold their allocations in
	// (0: the backend's, where it says; else no admission).
	DeviceMemory uint64
	// MaxGrace caps the grace period a guest may ask for.
	MaxGrace time.Duration
	// DeviceIdentity, where set (the replication key: every node of a
	// pair has it), names the devices guests see: identity.go derives
	// each GPU's UUID from it, so a device keeps its UUID across a
	// failover. Nil: guests see the GPUs' own UUIDs.
	DeviceIdentity []byte
	// ImageCacheBytes bounds the module images kept for the next process
	// that loads them by hash (package images); 0 keeps none.
	// ImageCacheTenantBytes bounds one tenant's share of them: a tenant's
	// images leave only for its own (0, or more than ImageCacheBytes: one
	// share of it all).
	ImageCacheBytes       int64
	ImageCacheTenantBytes int64
	// ImageUploadBytes bounds the module images one tenant's sessions
	// upload in pieces (too large for one frame), together, while they
	// are uploaded and not yet loaded.
	ImageUploadBytes int64
	// MMIO is how guest writes to apertures are traced.
	MMIO MMIOConfig
	// Clock tells the time detached sessions are kept by (lifetime.go);
	// nil is time.Now.
	Clock func() time.Time
}

// MMIOConfig configures aperture tracing (package aperture).
type MMIOConfig = aperture.Config

// DefaultConfig is sized for a shared GPU host.
func DefaultConfig() Config {
	return Config{
		WindowBase:  0x7e0000000000,
		WindowSize:  64 << 30,
		AllocAlign:  2 << 20,
		MaxSessions: 64,
		// A monitoring agent and a few nvidia-smi per guest.
		MaxStatusConns: 256,
		MemoryQuota:    4 << 30,
		MaxObjects:     16384,
		MaxPayload:     abi.DefaultMaxPayload,
		// Fourteen frames of the largest payload in flight at once; a
		// flood of announced frames cannot take the host's memory.
		RequestBufferBytes: 256 << 20,
		// Four replies of the largest payload: a guest that reads its
		// replies never meets it (the guest driver sends a copy_dtoh after
		// the last one's reply; a pipelined piece's reply is a few bytes).
		ReplyQueueBytes: 64 << 20,
		WriteTimeout:    30 * time.Second,
		// A tenant may spread one session's quota over a few sessions.
		TenantMemoryQuota: 4 << 30,
		TenantMaxSessions: 16,
		TenantMaxDetached: 4,
		MaxGrace:          2 * time.Minute,
		ImageCacheBytes:   1 << 30,
		// Two tenants' shares: a tenant alone on a node (a guest that
		// brings its own kernels has the node to itself) still has half
		// the cache, and the tenant before it keeps its images.
		ImageCacheTenantBytes: 512 << 20,
		// The largest image a guest may upload (abi.MaxImage).
		ImageUploadBytes: abi.MaxImage,
		MMIO:             MMIOConfig{Mode: mmiotrace.ModePage, Pin: true, FlushEvery: 10 * time.Millisecond},
	}
}

func (c Config) validate() error {
	switch {
	case c.WindowSize == 0 || c.AllocAlign == 0 || c.AllocAlign&(c.AllocAlign-1) != 0:
		return errors.New("window size must be non-zero and alloc alignment a power of two")
	case c.WindowBase%c.AllocAlign != 0 || c.WindowSize%c.AllocAlign != 0:
		return errors.New("window base and size must be multiples of the alloc alignment")
	case c.MaxSessions <= 0 || c.MaxStatusConns <= 0 || c.MaxObjects <= 0 || c.MaxPayload < 4096:
		return errors.New("max sessions, status connections and objects must be positive, max payload at least 4096")
	case c.WindowBase+uint64(c.MaxSessions)*c.WindowSize < c.WindowBase:
		return errors.New("session windows overflow the address space")
	case c.ImageCacheBytes < 0 || c.ImageCacheTenantBytes < 0 || c.ImageUploadBytes < 0:
		return errors.New("image cache bounds must not be negative")
	case c.TenantMaxSessions <= 0 || c.TenantMaxDetached < 0 || c.MaxGrace < 0:
		return errors.New("tenant session limits must be positive, detached limit and grace cap not negative")
	case c.RequestBufferBytes < 2*int64(c.MaxPayload):
		return errors.New("the request buffer budget must hold at least two frames of the largest payload")
	case c.ReplyQueueBytes < 0 || c.WriteTimeout < 0:
		return errors.New("the reply queue bound and the write timeout must not be negative")
	case c.Placement != "" && placement.Check(string(c.Placement)) != nil:
		return placement.Check(string(c.Placement))
	}
	return c.validateTenants()
}

// validateTenants refuses two named tenants that are one (two IPv6
// addresses of one /64: package tenancy).
func (c Config) validateTenants() error {
	named := map[string]string{}
	for id := range c.Tenants {
		canonical := tenancy.Canonical(id)
		if other, ok := named[canonical]; ok {
			return fmt.Errorf("tenants %s and %s are one tenant, %s (an IPv6 tenant is its /64 prefix)", min(id, other), max(id, other), canonical)
		}
		named[canonical] = id
	}
	return nil
}

// Server serves guest connections.
type Server struct {
	cfg     Config
	backend gpu.Backend
	devices []*device // the GPUs sessions are placed on (devices.go)
	log     *slog.Logger
	metrics *metrics
	edge    *guestconn.Edge // serves guest connections (package guestconn)
	images  *images.Cache   // module images by content (package images)

	mu        sync.Mutex
	sessions  map[uint64]*Session
	tenants   *tenancy.Registry // those with sessions or memory
	slots     []bool            // window slots in use
	nextID    uint64
	listeners map[net.Listener]struct{}
	repl      *replicate.Log // nil: not replicating
	mode      replicate.Mode
	term      uint64
	// termNow mirrors term for readers that must not wait for s.mu: the
	// replication sender's heartbeats carry it, and s.mu may be held for a
	// while (a resync snapshot stops the world), which a standby would
	// hear as silence and take for a dead primary.
	termNow  atomic.Uint64
	fenced   bool
	fencedBy string // why, as the role authority said (SetRole)
	serving  bool   // Serve was called: this node takes guests
	// fencedFlag mirrors fenced for sessions, which must not take s.mu.
	fencedFlag atomic.Bool
	// lease and unprotected guard a coordinated primary (Role.Lease).
	lease       atomic.Pointer[func() time.Time]
	unprotected atomic.Pointer[func() (allow, stop bool)]
	conns       map[net.Conn]struct{}
	closed      bool
	// statusConns counts the status connections open (status.go).
	statusConns int
	// ending counts sessions whose connection has ended and that are
	// being let go (freed, or kept for a resume); slotFreed is closed and
	// replaced whenever one is done or a slot is freed (lifetime.go).
	ending    int
	slotFreed chan struct{}
	wg        sync.WaitGroup
}

// NewServer returns a server running guests on backend. Metrics are
// registered on reg.
func NewServer(backend gpu.Backend, cfg Config, reg prometheus.Registerer, log *slog.Logger) (*Server, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("hypervisor config: %w", err)
	}
	if cfg.GuestKernels && cfg.MaxSessions != 1 && !gpu.IsolatesContexts(backend) {
		return nil, errors.New("hypervisor config: --guest.kernels needs GPU workers (--guest.workers on or auto) or --guest.max-sessions 1: " +
			"a guest-built kernel reaches every session's memory in its process")
	}
	s := &Server{
		cfg: cfg, backend: backend, log: log,
		sessions:  map[uint64]*Session{},
		slots:     make([]bool, cfg.MaxSessions),
		listeners: map[net.Listener]struct{}{},
		conns:     map[net.Conn]struct{}{},
		term:      1, // a node starts as the first primary; a promotion raises it
		images:    images.New(images.Config{Limit: cfg.ImageCacheBytes, Share: cfg.ImageCacheTenantBytes, Uploads: cfg.ImageUploadBytes}),
		slotFreed: make(chan struct{}),
		devices:   newDevices(backend),
	}
	s.termNow.Store(s.term)
	if s.cfg.Clock == nil {
		s.cfg.Clock = time.Now
	}
	if s.cfg.Placement == "" {
		s.cfg.Placement = placement.DefaultPolicy
	}
	if s.cfg.DeviceMemory == 0 {
		s.cfg.DeviceMemory = deviceMemory(s.devices)
	}
	s.tenants = tenancy.NewRegistry(tenancy.Config{
		Default:    TenantQuota{Memory: cfg.TenantMemoryQuota, Sessions: cfg.TenantMaxSessions, Detached: cfg.TenantMaxDetached},
		Tenants:    cfg.Tenants,
		Overcommit: cfg.TenantOvercommit, DeviceMemory: s.cfg.DeviceMemory,
	})
	m, err := newMetrics(reg, s)
	if err != nil {
		return nil, err
	}
	s.metrics = m
	s.edge = guestconn.New(guestNode{s}, guestconn.Config{MaxPayload: cfg.MaxPayload, RequestBufferBytes: cfg.RequestBufferBytes,
		ReplyQueueBytes: cfg.ReplyQueueBytes, WriteTimeout: cfg.WriteTimeout, Backend: gpu.Host(backend)},
		m.edge(), log)
	return s, nil
}

// ServeConn serves one guest connection until it ends (package
// guestconn). A frame that cannot be trusted (bad magic, version or
// checksum, over-long) gets an error reply and ends the connection; a
// well-framed request with bad content gets an error reply and the
// connection goes on. Either way only this connection's session is
// affected.
func (s *Server) ServeConn(conn net.Conn) { s.edge.ServeConn(conn) }

// Serve accepts guest connections on ln until Close. It returns nil after
// Close, or the listener's error.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return nil
	}
	s.listeners[ln] = struct{}{}
	if !s.serving {
		s.serving = true
		s.adoptDetachedLocked()
	}
	s.mu.Unlock()
	for {
		conn, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed || s.fenced
			delete(s.listeners, ln)
			s.mu.Unlock()
			if closed {
				return nil
			}
			return fmt.Errorf("accepting guests: %w", err)
		}
		if !s.track(conn) {
			conn.Close()
			return nil
		}
		go func() {
			defer s.wg.Done()
			defer s.untrack(conn)
			s.ServeConn(conn)
		}()
	}
}

func (s *Server) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	return true
}

func (s *Server) untrack(c net.Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// Close stops accepting, drops every guest connection, frees the sessions
// of those connections and waits for their goroutines to finish. A session
// already detached (waiting to be resumed) is freed when its grace period
// ends.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for ln := range s.listeners {
		ln.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// hello opens a session for a new guest, or resumes one.
func (s *Server) hello(payload []byte, p guestconn.Peer) (*Session, abi.Body, error) {
	var req abi.Hello
	if err := abi.Unmarshal(payload, &req); err != nil {
		return nil, nil, fail(abi.StatusInvalidValue, "decoding hello: %w", err)
	}
	if err := checkGuestName(req.GuestName); err != nil {
		return nil, nil, err
	}
	grace := s.grace(req.GraceMS, p.Log.Warn)
	if req.Resume != 0 {
		return s.resume(&req, grace)
	}
	slot, t, id, err := s.takeSlot(p.Tenant)
	if err != nil {
		return nil, nil, err
	}
	open := sessionOpen{Guest: req.GuestName, Token: newToken(), Tenant: p.Tenant, Grace: grace, GraceKnown: true, GPU: req.GPU}
	sess, err := s.newSession(id, slot, open, s.cfg.WindowBase+uint64(slot)*s.cfg.WindowSize, true)
	if err != nil {
		s.giveSlotBack(slot, t)
		return nil, nil, err
	}
	sess.mu.Lock()
	sess.attach(grace)
	sess.mu.Unlock()
	reply := &abi.HelloReply{Session: id, WindowBase: sess.mem.Base(), WindowSize: s.cfg.WindowSize, Term: s.Term()}
	if p.Version >= 2 { // a version-1 guest's decoder knows no token
		reply.Token = open.Token
	}
	return sess, reply, nil
}

// takeSlotLocked takes a window slot and a session of tenant id's quota.
// Precondition: s.mu must be locked.
func (s *Server) takeSlotLocked(id string) (int, *tenancy.Tenant, error) {
	if err := s.admitLocked(); err != nil {
		return 0, nil, err
	}
	slot := s.freeSlotLocked()
	if slot < 0 || s.closed {
		return 0, nil, fail(abi.StatusOutOfMemory, "hypervisor already serves %d guests (its --guest.max-sessions)", s.cfg.MaxSessions)
	}
	t, err := s.tenants.Admit(id)
	if err != nil {
		return 0, nil, err
	}
	if t != nil && t.Sessions >= t.Quota.Sessions {
		return 0, nil, refuse(guesterr.TenantSessions, abi.StatusOutOfMemory,
			"tenant %s already has %d sessions open, its limit (--tenant.max-sessions)", t.ID, t.Sessions)
	}
	s.slots[slot] = true
	if t != nil {
		t.Sessions++
	}
	return slot, t, nil
}

// resume hands an unattached session to the guest that proves it holds the
// session's resume token.
func (s *Server) resume(req *abi.Hello, grace time.Duration) (*Session, abi.Body, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fenced {
		return nil, nil, s.deposedLocked()
	}
	if s.leaseExpired() {
		return nil, nil, errLeaseExpired()
	}
	sess := s.sessions[req.Resume]
	if sess == nil {
		// The term tells a guest whose session only a deposed node held
		// that it is lost (pvdriver's search).
		return nil, &abi.HelloReply{Term: s.term}, fail(abi.StatusNoSession, "no session %d to resume on this node (term %d)", req.Resume, s.term)
	}
	sess.mu.Lock()
	defer sess.mu.Unlock()
	switch {
	case !tokenMatches(sess.token, req.Token):
		return nil, nil, refuse(guesterr.ResumeToken, abi.StatusInvalidValue, "session %d: missing or wrong resume token", req.Resume)
	case sess.failed != "":
		return nil, nil, fail(abi.StatusInternal, "session %d has failed (%s)", req.Resume, sess.failed)
	case sess.attached || sess.closed:
		return nil, nil, refuse(guesterr.ResumeAttached, abi.StatusInvalidValue, "session %d is already served on another connection", req.Resume)
	}
	sess.attach(grace)
	if sess.kept {
		sess.kept = false
		if sess.tenant != nil {
			sess.tenant.Detached--
		}
	}
	s.metrics.resumed.Inc()
	return sess, &abi.HelloReply{Session: sess.id, WindowBase: sess.mem.Base(), WindowSize: sess.mem.Size(), Term: s.term, Applied: sess.once.Last()}, nil
}

// Role is what the node's role authority decided, as the server needs
// it: the term it serves under, whether it is fenced for good and why,
// and, on a coordinated primary, its lease (see SetRole).
type Role struct {
	Term   uint64
	Fenced bool
	Why    string
	// Lease, when set, makes the server answer guests only while a
	// coordinator's lease is certainly this node's own: no request runs,
	// no session opens and no reply is sent once the time it returns has
	// passed (zero: not now). Unprotected then decides whether a reply
	// that no standby holds may be sent (allow), or never will (stop);
	// meanwhile the reply waits.
	Lease       func() time.Time
	Unprotected func() (allow, stop bool)
}

// SetRole makes the server act on its node's role: it serves under
// r.Term and stamps it on the log; fenced, it stops serving guests for
// good (connections dropped, new ones refused). The role authority is the
// only caller: the server never decides a role.
func (s *Server) SetRole(r Role) {
	s.mu.Lock()
	fenced := s.setRoleLocked(r)
	s.mu.Unlock()
	if fenced {
		s.log.Warn("fenced: no longer serving guests", "term", r.Term, "why", r.Why)
	}
}

// setRoleLocked is SetRole with s.mu held (a switchover's world stop
// holds it); it reports whether the node was fenced by it.
// Precondition: s.mu must be locked.
func (s *Server) setRoleLocked(r Role) (fenced bool) {
	s.term = r.Term
	s.termNow.Store(r.Term)
	if s.repl != nil {
		s.repl.SetTerm(r.Term)
	}
	if r.Lease != nil {
		s.lease.Store(&r.Lease)
		s.unprotected.Store(&r.Unprotected)
	}
	if !r.Fenced || s.fenced {
		return false
	}
	s.fencedBy = fmt.Sprintf("fenced at term %d: %s", r.Term, r.Why)
	s.fenceLocked()
	return true
}

// IsPrimary reports whether this node serves guests.
func (s *Server) IsPrimary() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.serving && !s.fenced
}

// Term is the node's term. It never waits for the server's lock.
func (s *Server) Term() uint64 { return s.termNow.Load() }

// deposedLocked refuses what a fenced node is asked: at once, and saying
// so (a guest goes to the next endpoint).
// Precondition: s.mu must be locked.
func (s *Server) deposedLocked() error {
	why := s.fencedBy
	if why == "" {
		why = "handed over to its standby"
	}
	return fail(abi.StatusDeposed, "deposed: this node no longer serves guests (%s; it served term %d); the session continues on the node that took over", why, s.term)
}

// fenceLocked fences the node. Sessions check the flag under their own
// lock before running anything, so a request that was waiting when the node
// was fenced is refused, never executed.
// Precondition: s.mu must be locked.
func (s *Server) fenceLocked() {
	s.fenced = true
	s.fencedFlag.Store(true)
	for ln := range s.listeners {
		ln.Close()
	}
	for c := range s.conns {
		c.Close()
	}
}

// leaseExpired reports whether a lease set by SetRole has run out.
func (s *Server) leaseExpired() bool {
	d := s.lease.Load()
	return d != nil && !time.Now().Before((*d)())
}

// errLeaseExpired refuses what a node whose lease ran out would do.
func errLeaseExpired() error {
	return fail(abi.StatusUnavailable, "this node's coordinator lease ran out: it may no longer serve; the session continues on the new primary")
}

// mayAnswerUnprotected waits until a reply the standby may not hold can be
// sent (see Role.Lease), or until held reports that the standby holds it.
func (s *Server) mayAnswerUnprotected(held func() bool) bool {
	f := s.unprotected.Load()
	if f == nil {
		return true
	}
	for {
		allow, stop := (*f)()
		switch {
		case allow || held():
			return true
		case stop:
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// newSession places a session on a GPU (devices.go; strict: a guest's,
// whose pin must name one of this node's and whose guest is shown that
// GPU, where a replica shows the one its record names) and creates it
// there, its guest seeing the window at base, and registers it (logging
// its opening when replicating).
func (s *Server) newSession(id uint64, slot int, open sessionOpen, base uint64, strict bool) (*Session, error) {
	dev, err := s.place(open.GPU, strict)
	if err != nil {
		return nil, err
	}
	ctx, err := dev.backend.NewContext(base, s.cfg.WindowSize)
	if err != nil {
		s.unplace(dev)
		return nil, err
	}
	got, _ := ctx.Window()
	if strict { // a guest's own session shows the GPU it is placed on; a replica the one its record names
		open.Device = dev.index
	}
	sess := &Session{
		id: id, guest: open.Guest, token: open.Token, slot: slot, cfg: s.cfg, fenced: &s.fencedFlag, srv: s,
		tenantID: open.Tenant, grace: open.GraceOr(s.cfg.MaxGrace), dev: dev, pin: open.GPU, shown: open.Device,
		ctx: ctx, mmioMetrics: s.metrics.mmio,
	}
	// A primary's guest sees whatever base its backend gave; only a
	// standby, bound to the primary's addresses, translates.
	sess.mem = devmem.New(ctx, devmem.Config{MemoryQuota: s.cfg.MemoryQuota, AllocAlign: s.cfg.AllocAlign, MaxPayload: s.cfg.MaxPayload,
		InPlaceBytes: s.metrics.countInPlace}, base, s.cfg.WindowSize, got-base)
	sess.objs = objects.New(ctx, sess.mem, objects.Config{
		Backend: dev.backend, GuestKernels: s.cfg.GuestKernels, MaxObjects: s.cfg.MaxObjects,
		Images: s.images, Tenant: open.Tenant, ImageBytes: s.metrics.countImageBytes,
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	sess.tenant = s.tenants.Get(open.Tenant) // counted by the caller
	sess.mem.Attach(sess.objs, sess.tenant)
	if sess.tenant != nil {
		s.images.Opened(open.Tenant) // its share of the image cache stays its own
	}
	if s.repl != nil {
		sess.setRecord(s.recorder(id))
		s.repl.Append(replicate.Record{Session: id, Op: replicate.OpSessionOpen, Result: base, Body: open.Append(nil)})
	}
	s.sessions[id] = sess
	return sess, nil
}

// sessionList returns the open sessions, in no order, for a caller that
// goes through them without holding s.mu.
func (s *Server) sessionList() []*Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	all := make([]*Session, 0, len(s.sessions))
	for _, sess := range s.sessions {
		all = append(all, sess)
	}
	return all
}

func (s *Server) closeSession(sess *Session) { s.closeSessionIf(sess, nil) }

// closeSessionIf frees sess if still(sess), checked under its lock (nil:
// always), and reports whether it did.
func (s *Server) closeSessionIf(sess *Session, still func(*Session) bool) bool {
	sess.mu.Lock()
	if sess.closed || still != nil && !still(sess) { // already closed (a failed session's guest leaving, a reset)
		sess.mu.Unlock()
		return false
	}
	sess.stopMMIO()
	sess.stopGrace()
	sess.closed = true
	if sess.record != nil {
		s.repl.Append(replicate.Record{Session: sess.id, Op: replicate.OpSessionClose})
	}
	if err := sess.ctx.Close(); err != nil {
		s.log.Error("closing backend context", "session", sess.id, "err", err)
	}
	t, kept := sess.tenant, sess.kept
	sess.mem.Release()
	sess.objs.Reset()
	sess.kept = false
	sess.mu.Unlock()
	s.mu.Lock()
	delete(s.sessions, sess.id)
	s.unplaceLocked(sess.dev)
	s.slots[sess.slot] = false
	if t != nil {
		t.Sessions--
		if kept {
			t.Detached--
		}
		s.tenants.Drop(t)
		s.images.Closed(t.ID)
	}
	s.signalSlotFreedLocked()
	s.mu.Unlock()
	return true
}

// SessionStatus is one session in Status.
type SessionStatus struct {
	ID         uint64 `json:"id,omitempty"`
	Guest      string `json:"guest,omitempty"`
	Tenant     string `json:"tenant,omitempty"`
	WindowBase string `json:"window_base"`
	// GPU is the index of the GPU the session was placed on (GPUs).
	GPU         int    `json:"gpu"`
	Allocations int    `json:"allocations"`
	Bytes       uint64 `json:"bytes"`
	Objects     int    `json:"objects"`
	Requests    uint64 `json:"requests"`
	// Translated: the backend's window is not at the guest's base, so
	// addresses are translated (degraded: pointers stored in device memory
	// are not). Unsafe says why a replica session cannot be trusted.
	Translated bool   `json:"translated,omitempty"`
	Unsafe     string `json:"unsafe,omitempty"`
	// Failed says why the session stopped serving (guard.go).
	Failed string `json:"failed,omitempty"`
	// Detached: no connection serves the session. DetachedSeconds is how
	// long this node has kept it so (since its connection ended here, or
	// since this node began to serve), ExpiresInSeconds how long it still
	// keeps it unless a guest resumes it; both 0 on a standby, whose
	// primary keeps the time (lifetime.go).
	Detached         bool    `json:"detached"`
	DetachedSeconds  float64 `json:"detached_seconds"`
	ExpiresInSeconds float64 `json:"expires_in_seconds"`
	// MMIO describes the session's traced apertures, if it has any.
	MMIO *MMIOStatus `json:"mmio,omitempty"`
}

// MMIOStatus is a session's aperture tracing in Status.
type MMIOStatus = aperture.Status

// TenantQuota bounds one tenant (package tenancy).
type TenantQuota = tenancy.Quota

// TenantStatus is one tenant in Status; TenancyStatus the device's
// share-out among tenants (package tenancy).
type (
	TenantStatus  = tenancy.TenantStatus
	TenancyStatus = tenancy.Status
)

// tenancy reports every tenant present.
func (s *Server) tenancy() TenancyStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tenants.Status()
}

// ImageStatus describes the module images a node keeps by content
// (package images).
type ImageStatus = images.Status

// Status is what /status reports.
type Status struct {
	Backend string `json:"backend"`
	// GPUs are the node's GPUs and the sessions placed on each.
	GPUs     []GPUStatus     `json:"gpus"`
	Sessions []SessionStatus `json:"sessions"`
	Objects  int             `json:"objects"`
	Bytes    uint64          `json:"bytes"`
	Term     uint64          `json:"term"`
	Primary  bool            `json:"is_primary"`
	// Detached counts sessions no connection serves (kept for a resume, or
	// a standby's replicas); OldestDetachedSeconds is the longest any of
	// them has been kept so on this node's clock.
	Detached              int     `json:"detached_sessions"`
	OldestDetachedSeconds float64 `json:"oldest_detached_seconds"`
	// Tenancy: the device memory each tenant's sessions hold (package
	// tenancy).
	Tenancy TenancyStatus `json:"tenancy"`
	// Images: the module images this node keeps by content (package images).
	Images ImageStatus `json:"images"`
	// StatusConnections counts the guests' status connections open
	// (status.go: NVML watching the device without a session).
	StatusConnections int `json:"status_connections"`
}

// Redacted is the status without what identifies a session (its id, its
// guest's name, its tenant): what an admin caller without the token sees.
func (st Status) Redacted() Status {
	st.Sessions = append([]SessionStatus{}, st.Sessions...)
	for i := range st.Sessions {
		st.Sessions[i].ID, st.Sessions[i].Guest, st.Sessions[i].Tenant = 0, "", ""
	}
	st.Tenancy.Tenants = append([]TenantStatus{}, st.Tenancy.Tenants...)
	for i := range st.Tenancy.Tenants {
		st.Tenancy.Tenants[i].Tenant = ""
	}
	return st
}

// Status reports the server's sessions and totals.
func (s *Server) Status() Status {
	sessions := s.sessionList()
	sort.Slice(sessions, func(i, j int) bool { return sessions[i].id < sessions[j].id })
	st := Status{Backend: s.backend.Name(), Sessions: []SessionStatus{}, Term: s.Term(), Primary: s.IsPrimary(), Tenancy: s.tenancy(),
		Images: s.images.Status(), StatusConnections: s.statusConnections()}
	now := s.now()
	for _, sess := range sessions {
		sess.mu.Lock()
		ss := SessionStatus{
			ID: sess.id, Guest: sess.guest, Tenant: sess.tenantID, WindowBase: fmt.Sprintf("%#x", sess.mem.Base()), GPU: sess.dev.index,
			Allocations: sess.mem.Allocations(), Bytes: sess.mem.Bytes(),
			Objects:    sess.mem.Allocations() + sess.objs.Len(),
			Requests:   sess.requests,
			Translated: sess.mem.Translated(),
			Unsafe:     sess.unsafe,
			Failed:     sess.failed,
		}
		if sess.mmio != nil {
			ss.MMIO = sess.mmio.Status()
		}
		if !sess.attached {
			st.Detached++
			ss.Detached = true
		}
		if !sess.detachedAt.IsZero() {
			ss.DetachedSeconds = now.Sub(sess.detachedAt).Seconds()
			ss.ExpiresInSeconds = max(sess.expires.Sub(now).Seconds(), 0)
			st.OldestDetachedSeconds = max(st.OldestDetachedSeconds, ss.DetachedSeconds)
		}
		sess.mu.Unlock()
		st.Sessions = append(st.Sessions, ss)
		st.Objects += ss.Objects
		st.Bytes += ss.Bytes
	}
	st.GPUs = s.gpuStatus(st.Sessions)
	return st
}
