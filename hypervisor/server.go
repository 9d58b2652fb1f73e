// Package hypervisor is the primary's backend for guest GPU calls: it accepts
// guest connections, keeps one Session per guest, validates every request
// against that guest's own allocations and handles, and executes it on a
// gpu.Backend.
//
// It owns: sessions, the guest device-address windows and the deterministic
// allocator inside them, per-guest quotas and isolation, the handler table
// (opTable: one handler per row of abi's opcode table, which says what each
// opcode is), and a guest's apertures (aperture.go): the memory files it writes
// directly, whose writes it collects through package mmiotrace at every
// call's entry and turns into log records.
// It must never: trust a byte a guest sends (package abi decodes), let one
// guest name another's memory or handles, or let a guest's misbehaviour
// (garbage, a cut connection, a flood) affect any other session.
//
// One goroutine serves each connection and runs its requests in order. The
// per-session mutex serialises those requests with everything else that
// touches the session: status readers, the aperture flush timer, a
// snapshot or switchover stopping every session (stopTheWorld), and fencing.
package hypervisor

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/handlemap"
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
	// MemoryQuota bounds each session's allocated bytes.
	MemoryQuota uint64
	// MaxObjects bounds each session's allocations plus handles.
	MaxObjects int
	// MaxPayload bounds a frame's payload.
	MaxPayload int
	// MMIO is how guest writes to apertures are traced.
	MMIO MMIOConfig
}

// MMIOConfig configures aperture tracing (package mmiotrace).
type MMIOConfig struct {
	Mode mmiotrace.Mode
	// Pin puts the tracer and the guest's threads on one CPU while ptrace
	// traces them (3–4× cheaper per traced write).
	Pin bool
	// FlushEvery flushes a session's aperture writes on a timer too, for
	// guests that write without making calls.
	FlushEvery time.Duration
	// StepOnly single-steps every traced store instead of emulating it
	// (for measuring the paper's unprotect/step/re-protect path).
	StepOnly bool
}

// DefaultConfig is sized for a shared GPU host.
func DefaultConfig() Config {
	return Config{
		WindowBase:  0x7e0000000000,
		WindowSize:  64 << 30,
		AllocAlign:  2 << 20,
		MaxSessions: 64,
		MemoryQuota: 4 << 30,
		MaxObjects:  16384,
		MaxPayload:  abi.DefaultMaxPayload,
		MMIO:        MMIOConfig{Mode: mmiotrace.ModePage, Pin: true, FlushEvery: 10 * time.Millisecond},
	}
}

func (c Config) validate() error {
	switch {
	case c.WindowSize == 0 || c.AllocAlign == 0 || c.AllocAlign&(c.AllocAlign-1) != 0:
		return errors.New("window size must be non-zero and alloc alignment a power of two")
	case c.WindowBase%c.AllocAlign != 0 || c.WindowSize%c.AllocAlign != 0:
		return errors.New("window base and size must be multiples of the alloc alignment")
	case c.MaxSessions <= 0 || c.MaxObjects <= 0 || c.MaxPayload < 4096:
		return errors.New("max sessions and objects must be positive, max payload at least 4096")
	case c.WindowBase+uint64(c.MaxSessions)*c.WindowSize < c.WindowBase:
		return errors.New("session windows overflow the address space")
	}
	return nil
}

// Server serves guest connections.
type Server struct {
	cfg     Config
	backend gpu.Backend
	log     *slog.Logger
	metrics *metrics

	mu        sync.Mutex
	sessions  map[uint64]*Session
	slots     []bool // window slots in use
	nextID    uint64
	listeners map[net.Listener]struct{}
	repl      *replicate.Log // nil: not replicating
	mode      replicate.Mode
	term      uint64
	fenced    bool
	serving   bool // Serve was called: this node takes guests
	// fencedFlag mirrors fenced for sessions, which must not take s.mu.
	fencedFlag atomic.Bool
	conns      map[net.Conn]struct{}
	closed     bool
	wg         sync.WaitGroup
}

// NewServer returns a server running guests on backend. Metrics are
// registered on reg.
func NewServer(backend gpu.Backend, cfg Config, reg prometheus.Registerer, log *slog.Logger) (*Server, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("hypervisor config: %w", err)
	}
	s := &Server{
		cfg: cfg, backend: backend, log: log,
		sessions:  map[uint64]*Session{},
		slots:     make([]bool, cfg.MaxSessions),
		listeners: map[net.Listener]struct{}{},
		conns:     map[net.Conn]struct{}{},
		term:      1, // a node starts as the first primary; a promotion raises it
	}
	m, err := newMetrics(reg, s)
	if err != nil {
		return nil, err
	}
	s.metrics = m
	return s, nil
}

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
	s.serving = true
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

// ServeConn serves one guest connection until it ends. A frame that cannot
// be trusted (bad magic, version or checksum, over-long) gets an error reply
// and ends the connection; a well-framed request with bad content gets an
// error reply and the connection goes on. Either way only this connection's
// session is affected.
func (s *Server) ServeConn(conn net.Conn) {
	defer conn.Close()
	br := bufio.NewReaderSize(conn, 64<<10)
	bw := bufio.NewWriterSize(conn, 64<<10)
	fr := abi.NewFrameReader(br, s.cfg.MaxPayload)
	log := s.log.With("remote", conn.RemoteAddr().String())
	var sess *Session
	defer func() {
		if sess != nil {
			s.detach(sess, log)
		}
	}()
	var out []byte
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			if err == io.EOF || errors.Is(err, net.ErrClosed) {
				return
			}
			reason := frameErrorReason(err)
			s.metrics.frameErrors.WithLabelValues(reason).Inc()
			log.Warn("dropping guest connection", "reason", reason, "err", err)
			if reason != "io" {
				op := f.Op
				if !op.Valid() {
					op = abi.OpReject
				}
				out = abi.AppendFrame(out[:0], op, abi.FlagReply, f.RequestID,
					abi.AppendReply(nil, abi.StatusBadFrame, err.Error(), nil))
				bw.Write(out)
				bw.Flush()
			}
			return
		}
		var reply abi.Body
		var rerr error
		switch {
		case f.Flags&abi.FlagReply != 0:
			rerr = fail(abi.StatusBadFrame, "guest sent a reply frame")
		case sess == nil && f.Op != abi.OpHello:
			rerr = fail(abi.StatusInvalidValue, "first request must be hello, got %s", f.Op)
		case f.Op == abi.OpBye && sess != nil:
			sess.mu.Lock()
			sess.grace = 0 // the guest is done: free the session now
			sess.mu.Unlock()
			return
		case f.Op == abi.OpHello:
			if sess != nil {
				rerr = fail(abi.StatusInvalidValue, "session %d is already open on this connection", sess.id)
				break
			}
			sess, reply, rerr = s.hello(f.Payload)
			if sess != nil {
				sess.mu.Lock()
				sess.peerPID = mmiotrace.PeerPID(conn)
				sess.mu.Unlock()
				log = log.With("session", sess.id, "guest", sess.guest)
				log.Info("guest session opened", "window_base", fmt.Sprintf("%#x", sess.base))
			}
		default:
			timer := prometheus.NewTimer(s.metrics.latency[f.Op])
			reply, rerr = sess.handle(f.Op, f.RequestID, f.Flags&abi.FlagAsync != 0, f.Payload)
			timer.ObserveDuration()
		}
		s.metrics.requests.WithLabelValues(f.Op.String(), statusOf(rerr).String()).Inc()
		if f.Flags&abi.FlagAsync != 0 && rerr == nil {
			// No reply: the guest is pipelining. Errors were kept by handle.
		} else {
			if s.mustWait(f.Op, rerr) {
				if !s.repl.WaitApplied(s.repl.Last()) && s.repl.Closed() {
					// The node is going down: this reply could tell the
					// guest of a change the standby may never get. No
					// reply; the guest resumes on the standby.
					return
				}
			}
			st, msg := abi.StatusOK, ""
			if rerr != nil {
				st, msg = statusOf(rerr), rerr.Error()
				log.Debug("request refused", "op", f.Op, "status", st, "err", rerr)
			}
			out = abi.AppendFrame(out[:0], f.Op, abi.FlagReply, f.RequestID, abi.AppendReply(nil, st, msg, reply))
			if _, err := bw.Write(out); err != nil {
				return
			}
		}
		if br.Buffered() == 0 {
			if err := bw.Flush(); err != nil {
				return
			}
		}
	}
}

func frameErrorReason(err error) string {
	var ve *abi.VersionError
	var tl *abi.TooLargeError
	switch {
	case errors.Is(err, abi.ErrBadMagic):
		return "magic"
	case errors.As(err, &ve):
		return "version"
	case errors.As(err, &tl):
		return "too_large"
	case errors.Is(err, abi.ErrChecksum):
		return "checksum"
	case errors.Is(err, abi.ErrBadOpcode):
		return "opcode"
	case errors.Is(err, abi.ErrReserved):
		return "reserved"
	}
	return "io" // cut mid-frame or a socket error: nobody to reply to
}

// hello opens a session for a new guest.
func (s *Server) hello(payload []byte) (*Session, abi.Body, error) {
	var req abi.Hello
	if err := abi.Unmarshal(payload, &req); err != nil {
		return nil, nil, fail(abi.StatusInvalidValue, "decoding hello: %w", err)
	}
	s.mu.Lock()
	if s.fenced {
		s.mu.Unlock()
		return nil, nil, fail(abi.StatusUnavailable, "this node was fenced by a newer primary (term above %d)", s.term)
	}
	if req.Resume != 0 {
		defer s.mu.Unlock()
		sess := s.sessions[req.Resume]
		if sess == nil {
			return nil, nil, fail(abi.StatusInvalidValue, "no session %d to resume on this node", req.Resume)
		}
		sess.mu.Lock()
		defer sess.mu.Unlock()
		if sess.attached || sess.closed {
			return nil, nil, fail(abi.StatusInvalidValue, "session %d is already served on another connection", req.Resume)
		}
		sess.attached = true
		sess.grace = time.Duration(req.GraceMS) * time.Millisecond
		return sess, &abi.HelloReply{Session: sess.id, WindowBase: sess.base, WindowSize: sess.size, Term: s.term, Applied: sess.lastReq}, nil
	}
	slot := -1
	for i, used := range s.slots {
		if !used {
			slot = i
			break
		}
	}
	if slot < 0 || s.closed {
		s.mu.Unlock()
		return nil, nil, fail(abi.StatusOutOfMemory, "hypervisor already serves %d guests", s.cfg.MaxSessions)
	}
	s.slots[slot] = true
	s.nextID++
	id := s.nextID
	s.mu.Unlock()

	sess, err := s.newSession(id, slot, req.GuestName, s.cfg.WindowBase+uint64(slot)*s.cfg.WindowSize)
	if err != nil {
		s.releaseSlot(slot)
		return nil, nil, err
	}
	sess.mu.Lock()
	sess.attached = true
	sess.grace = time.Duration(req.GraceMS) * time.Millisecond
	sess.mu.Unlock()
	return sess, &abi.HelloReply{Session: id, WindowBase: sess.base, WindowSize: s.cfg.WindowSize, Term: s.Term()}, nil
}

// SetTerm sets the term this node serves under (a promoted standby raises
// it).
func (s *Server) SetTerm(t uint64) {
	s.mu.Lock()
	s.term = t
	s.mu.Unlock()
	if s.repl != nil {
		s.repl.SetTerm(t)
	}
}

// IsPrimary reports whether this node serves guests.
func (s *Server) IsPrimary() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.serving && !s.fenced
}

// Term is the node's term.
func (s *Server) Term() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.term
}

// Fence stops this node serving guests for good: a node with a higher term
// has taken over. Guest connections are dropped; new ones are refused.
func (s *Server) Fence(newer uint64) {
	s.mu.Lock()
	already := s.fenced
	s.fenceLocked()
	s.mu.Unlock()
	if !already {
		s.log.Warn("fenced: a newer primary has taken over; no longer serving guests", "newer_term", newer)
	}
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

// newSession creates a session whose guest sees the window at base, and
// registers it (logging its opening when replicating).
func (s *Server) newSession(id uint64, slot int, guest string, base uint64) (*Session, error) {
	ctx, err := s.backend.NewContext(base, s.cfg.WindowSize)
	if err != nil {
		return nil, err
	}
	got, _ := ctx.Window()
	sess := &Session{
		id: id, guest: guest, slot: slot, cfg: s.cfg, fenced: &s.fencedFlag,
		ctx: ctx, backend: s.backend, base: base, size: s.cfg.WindowSize,
		// A primary's guest sees whatever base its backend gave; only a
		// standby, bound to the primary's addresses, translates.
		delta:        got - base,
		handles:      handlemap.NewTable(),
		kernels:      map[handlemap.Handle]abi.KernelSpec{},
		moduleImages: map[handlemap.Handle]*abi.ModuleImage{},
		deferred:     map[handlemap.Handle]error{},
		mmioMetrics:  s.metrics.mmio,
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.repl != nil {
		sess.record = s.recorder(id)
		s.repl.Append(replicate.Record{Session: id, Op: replicate.OpSessionOpen, Result: base, Body: []byte(guest)})
	}
	s.sessions[id] = sess
	return sess, nil
}

// detach handles the end of a session's connection: the session is freed,
// or, if its guest asked for a grace period (it can fail over), kept that
// long for the guest to resume it here or on a promoted standby.
func (s *Server) detach(sess *Session, log *slog.Logger) {
	sess.mu.Lock()
	sess.stopMMIO()
	grace := sess.grace
	sess.attached = false
	sess.mu.Unlock()
	s.mu.Lock()
	closing := s.closed || s.fenced
	s.mu.Unlock()
	if grace <= 0 || closing {
		s.closeSession(sess)
		log.Info("guest session closed", "requests", sess.requests)
		return
	}
	log.Info("guest connection lost; keeping the session for it to resume", "grace", grace)
	time.AfterFunc(grace, func() {
		sess.mu.Lock()
		expired := !sess.attached && !sess.closed
		sess.mu.Unlock()
		if expired {
			s.closeSession(sess)
			log.Info("guest session closed: not resumed within its grace period", "requests", sess.requests)
		}
	})
}

func (s *Server) releaseSlot(slot int) {
	s.mu.Lock()
	s.slots[slot] = false
	s.mu.Unlock()
}

func (s *Server) closeSession(sess *Session) {
	sess.mu.Lock()
	sess.stopMMIO()
	sess.closed = true
	if sess.record != nil {
		s.repl.Append(replicate.Record{Session: sess.id, Op: replicate.OpSessionClose})
	}
	if err := sess.ctx.Close(); err != nil {
		s.log.Error("closing backend context", "session", sess.id, "err", err)
	}
	sess.ranges = handlemap.Ranges{}
	sess.handles = handlemap.NewTable()
	sess.mu.Unlock()
	s.mu.Lock()
	delete(s.sessions, sess.id)
	s.slots[sess.slot] = false
	s.mu.Unlock()
}

// SessionStatus is one session in Status.
type SessionStatus struct {
	ID          uint64 `json:"id"`
	Guest       string `json:"guest"`
	WindowBase  string `json:"window_base"`
	Allocations int    `json:"allocations"`
	Bytes       uint64 `json:"bytes"`
	Objects     int    `json:"objects"`
	Requests    uint64 `json:"requests"`
	// Translated: the backend's window is not at the guest's base, so
	// addresses are translated (degraded: pointers stored in device memory
	// are not). Unsafe says why a replica session cannot be trusted.
	Translated bool   `json:"translated,omitempty"`
	Unsafe     string `json:"unsafe,omitempty"`
	// MMIO describes the session's traced apertures, if it has any.
	MMIO *MMIOStatus `json:"mmio,omitempty"`
}

// MMIOStatus is a session's aperture tracing in Status.
type MMIOStatus struct {
	Mode      string `json:"mode"`
	Apertures int    `json:"apertures"`
	// PinnedCPU is the CPU the tracer and the guest's threads share while
	// ptrace traces them (-1: not pinned or no ptrace).
	PinnedCPU int    `json:"pinned_cpu"`
	Faults    uint64 `json:"faults"`
	Records   uint64 `json:"records"`
	Bytes     uint64 `json:"bytes"`
}

// Status is what /status reports.
type Status struct {
	Backend  string          `json:"backend"`
	Sessions []SessionStatus `json:"sessions"`
	Objects  int             `json:"objects"`
	Bytes    uint64          `json:"bytes"`
	Term     uint64          `json:"term"`
	Primary  bool            `json:"is_primary"`
}

// Status reports the server's sessions and totals.
func (s *Server) Status() Status {
	s.mu.Lock()
	sessions := make([]*Session, 0, len(s.sessions))
	for _, sess := range s.sessions {
		sessions = append(sessions, sess)
	}
	s.mu.Unlock()
	sort.Slice(sessions, func(i, j int) bool { return sessions[i].id < sessions[j].id })
	st := Status{Backend: s.backend.Name(), Sessions: []SessionStatus{}, Term: s.Term(), Primary: s.IsPrimary()}
	for _, sess := range sessions {
		sess.mu.Lock()
		ss := SessionStatus{
			ID: sess.id, Guest: sess.guest, WindowBase: fmt.Sprintf("%#x", sess.base),
			Allocations: sess.ranges.Len(), Bytes: sess.ranges.Total(),
			Objects:    sess.ranges.Len() + sess.handles.Len(),
			Requests:   sess.requests,
			Translated: sess.delta != 0,
			Unsafe:     sess.unsafe,
			MMIO:       sess.mmioStatus(),
		}
		sess.mu.Unlock()
		st.Sessions = append(st.Sessions, ss)
		st.Objects += ss.Objects
		st.Bytes += ss.Bytes
	}
	return st
}
