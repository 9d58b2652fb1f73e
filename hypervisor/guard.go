package hypervisor

import (
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/vgpuha/vgpuha/hypervisor/internal/guesterr"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
)

// No panic crosses a request boundary. Everything a guest sends is checked
// before it is used, but a bug left in a handler, a kernel or a backend
// must cost one request, not the node (and after a failover, the standby
// that replays it). So each guest request, each replicated record and each
// timer-driven flush runs under a recover that:
//   - fails that request with StatusInternal (the guest is told);
//   - when the request changes state (it may have stopped halfway), fails
//     its session: later requests are refused, the standby is told to
//     drop the session, and the session is freed when its guest goes;
//   - never lets the request reach the replication log: the log is written
//     after a handler returns, which a panic skips;
//   - logs the session, the op and the stack, and counts it in
//     vgpuha_guest_request_panics_total.

// panicked turns a panic p recovered while serving one guest request of
// op (guestconn recovers it) into the request's error.
func (s *Server) panicked(sess *Session, op abi.Opcode, p any, log *slog.Logger) error {
	s.metrics.panics.WithLabelValues(op.String()).Inc()
	log.Error("recovered from a panic while serving a guest request; the request failed",
		"op", op, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
	if sess != nil && op.Info().Mutates {
		s.failSession(sess, fmt.Sprintf("internal error in %s", op))
		return fail(abi.StatusInternal, "internal error while serving %s; the session may be torn and has failed", op)
	}
	return fail(abi.StatusInternal, "internal error while serving %s; nothing was changed", op)
}

// failSession stops a session serving: its state may be torn. The standby
// drops its copy now (the log gets the session's close, and nothing more of
// it); this node frees the session when its guest disconnects.
func (s *Server) failSession(sess *Session, why string) {
	sess.mu.Lock()
	sess.failLocked(why)
	sess.mu.Unlock()
}

// Precondition: s.mu must be locked.
func (s *Session) failLocked(why string) {
	if s.failed == "" {
		s.failed = why
	}
	if s.record != nil {
		s.record.append(replicate.OpSessionClose, 0, nil, 0, 0, nil)
		s.setRecord(nil)
	}
}

// recoverFlush is deferred around a timer-driven aperture flush (which runs
// on its own goroutine, with s.mu held): a panic fails the session instead
// of the process.
// Precondition: s.mu must be locked.
func (s *Session) recoverFlush() {
	p := recover()
	if p == nil {
		return
	}
	s.srv.metrics.panics.WithLabelValues(replicate.OpMMIO.String()).Inc()
	s.srv.log.Error("recovered from a panic while flushing aperture writes; the session failed",
		"session", s.id, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
	s.failLocked("internal error flushing aperture writes") // the timer stops flushing a failed session
}

// refuse is fail with a counted reason (guesterr.Reasons).
var refuse = guesterr.Refuse
