package hypervisor

import (
	"log/slog"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/guestconn"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// The node's guest connections are package guestconn's: it reads their
// frames, decides where a copy's bytes come from and orders the replies;
// the server opens and lets go of sessions for it (guestNode), and each
// session runs the requests (Session.Serve).

// guestNode is the server as its guest connections see it
// (guestconn.Node).
type guestNode struct{ s *Server }

func (n guestNode) Hello(payload []byte, p guestconn.Peer) (guestconn.Session, abi.Body, error) {
	sess, reply, err := n.s.hello(payload, p)
	if sess == nil {
		return nil, reply, err
	}
	return sess, reply, err
}

func (n guestNode) Detach(sess guestconn.Session, log *slog.Logger) { n.s.detach(sess.(*Session), log) }
func (n guestNode) SessionEnding() func()                           { return n.s.sessionEnding() }
func (n guestNode) LeaseExpired() bool                              { return n.s.leaseExpired() }

func (n guestNode) ReplyGate(op abi.Opcode, err error) func() bool { return n.s.replyGate(op, err) }

func (n guestNode) Panicked(sess guestconn.Session, op abi.Opcode, p any, log *slog.Logger) (abi.Body, error) {
	s, _ := sess.(*Session)
	return nil, n.s.panicked(s, op, p, log)
}

// ID implements guestconn.Session.
func (s *Session) ID() uint64 { return s.id }

// Guest implements guestconn.Session.
func (s *Session) Guest() string { return s.guest }

// Base implements guestconn.Session.
func (s *Session) Base() uint64 { return s.mem.Base() }

// GPU implements guestconn.Session: the GPU it was placed on.
func (s *Session) GPU() int { return s.dev.index }

// Opened implements guestconn.Session.
func (s *Session) Opened(peerPID int, host *guestconn.Region) {
	s.mu.Lock()
	s.peerPID = peerPID
	s.mem.SetHost(host)
	s.mu.Unlock()
}

// Idle implements guestconn.Session (and, through package replica, a
// standby's lane that has no more records of the session for now): a
// context that batches launches (gpu.LaunchBatcher) hands on those it
// holds. A failure is the context's loss, which its next call reports.
func (s *Session) Idle() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b, ok := s.ctx.(gpu.LaunchBatcher); ok {
		b.Flush()
	}
}

// EndGrace implements guestconn.Session.
func (s *Session) EndGrace() {
	s.mu.Lock()
	s.grace = 0
	s.mu.Unlock()
}

// DeferError implements guestconn.Session: the error is kept for the null
// stream (the request's own stream is in the payload it did not read), and
// a new state-changing request counts as failed (failures.go).
func (s *Session) DeferError(op abi.Opcode, reqID uint64, err error) { s.deferUnread(op, reqID, err) }

// DropRegion implements guestconn.Session: the session forgets region
// (unless a resume gave it another already) and its device work is waited
// for if a copy from the region may still be running.
func (s *Session) DropRegion(region *guestconn.Region) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mem.Host() == region {
		s.mem.SetHost(nil)
	}
	if region.Queued() && !s.closed {
		return s.ctx.Sync()
	}
	return nil
}
