package hypervisor

import (
	"log/slog"
	"time"

	"github.com/vgpuha/vgpuha/hypervisor/internal/guesterr"
	"github.com/vgpuha/vgpuha/hypervisor/tenancy"
)

// A session's lifetime. Every session has exactly one owner and one clock:
// the node that serves guests. While a connection serves the session it
// lives; when that connection ends the guest may come back (a network
// blip, a failover) within the grace period it was granted, and the
// session is kept that long, then freed. The clock is the serving node's
// (Config.Clock), and the grace period travels with the session
// (sessionOpen), so that:
//
//   - a session whose connection ended here is freed here when its grace
//     runs out (detach);
//   - a standby keeps its replicas without a clock of its own: its primary
//     frees them, and the log tells it so (OpSessionClose);
//   - a node that begins to serve guests (a promoted standby) adopts every
//     session no connection serves and gives each its grace from that
//     moment (adoptDetachedLocked): a guest has its whole grace to find the
//     new primary, and a session whose guest died with the old primary, or
//     whose hello never got its reply there, is freed as on the primary.
//
// A session whose hello reply never went out (held for the standby, and
// the guest gave up or died first) is freed when its connection ends:
// nobody was told of it (guestConn.answeringHello). A guest that is done
// says bye: its session is freed before the bye is answered
// (guestConn.goodbye), so a program's slot is free once its process has
// exited. A hello that finds every slot taken while some session is still
// being let go waits for that, up to closingSlotWait (takeSlot), instead
// of refusing the guest.

// closingSlotWait bounds how long a hello waits for a slot that a session
// whose connection ended is about to free.
const closingSlotWait = 2 * time.Second

// now is the server's clock.
func (s *Server) now() time.Time { return s.cfg.Clock() }

// detach handles the end of a session's connection: the session is freed,
// or, if its guest asked for a grace period (it can fail over), kept that
// long for the guest to resume it here or on a promoted standby.
func (s *Server) detach(sess *Session, log *slog.Logger) {
	sess.mu.Lock()
	sess.stopMMIO()
	grace := sess.grace
	if sess.failed != "" {
		grace = 0 // nothing to resume: free it now
	}
	sess.mu.Unlock()
	s.mu.Lock()
	sess.mu.Lock()
	sess.attached = false
	keep := grace > 0 && !s.closed && !s.fenced
	t := sess.tenant
	over := keep && t != nil && t.Detached >= t.Quota.Detached
	if keep && !over {
		sess.kept = true
		if t != nil {
			t.Detached++
		}
		s.startGraceLocked(sess, grace)
	}
	sess.mu.Unlock()
	s.mu.Unlock()
	if over {
		s.metrics.refusals.WithLabelValues(guesterr.TenantDetached).Inc()
		log.Warn("guest connection lost; not keeping the session: its tenant keeps the most detached sessions it may",
			"tenant", t.ID, "limit", t.Quota.Detached)
	}
	if !keep || over {
		s.closeSession(sess)
		log.Info("guest session closed", "requests", sess.requests)
		return
	}
	log.Info("guest connection lost; keeping the session for it to resume", "grace", grace)
}

// startGraceLocked starts sess's grace period on this node's clock: it is
// freed at expires unless a guest resumes it first.
// Precondition: s.mu and sess.mu must be locked.
func (s *Server) startGraceLocked(sess *Session, grace time.Duration) {
	sess.stopGrace()
	sess.detachedAt = s.now()
	sess.expires = sess.detachedAt.Add(grace)
	sess.expiry = time.AfterFunc(grace, s.expireDetached)
}

// stopGrace ends the session's grace period (it was resumed or closed).
// Precondition: s.mu must be locked.
func (s *Session) stopGrace() {
	if s.expiry != nil {
		s.expiry.Stop()
	}
	s.expiry, s.detachedAt, s.expires = nil, time.Time{}, time.Time{}
}

// adoptDetachedLocked makes this node, which has just begun to serve
// guests, the owner of every session no connection serves (a promoted
// standby's replicas): each is kept for its grace period from now, counted
// in its tenant's detached sessions (not limited: its primary allowed it),
// and freed unless resumed. A session whose guest asked for no grace can
// never be resumed and is freed at once.
// Precondition: s.mu must be locked.
func (s *Server) adoptDetachedLocked() {
	adopted := 0
	for _, sess := range s.sessions {
		sess.mu.Lock()
		if !sess.attached && !sess.closed && sess.expiry == nil {
			if !sess.kept && sess.tenant != nil {
				sess.tenant.Detached++
			}
			sess.kept = true
			s.startGraceLocked(sess, min(sess.grace, s.cfg.MaxGrace))
			adopted++
		}
		sess.mu.Unlock()
	}
	if adopted > 0 {
		s.log.Info("serving guests: keeping the sessions no guest is connected to for their grace period", "sessions", adopted)
	}
}

// expireDetached frees every session whose grace period has run out by
// the server's clock. Each session's timer calls it; a test with its own
// clock calls it after moving that clock on.
func (s *Server) expireDetached() {
	now := s.now()
	expired := func(sess *Session) bool {
		return !sess.attached && !sess.expires.IsZero() && !now.Before(sess.expires)
	}
	for _, sess := range s.sessionList() {
		if s.closeSessionIf(sess, expired) {
			s.metrics.expired.Inc()
			s.log.Info("guest session closed: not resumed within its grace period", "session", sess.id, "guest", sess.guest)
		}
	}
}

// takeSlot takes a window slot, a session of the tenant's quota and a
// session id for a hello. When every slot is taken but some session is
// being let go (its guest said bye, or its connection just ended), it
// waits for that, up to closingSlotWait, before it refuses: a program
// started right after another one exited gets the slot that one held.
func (s *Server) takeSlot(tenantID string) (slot int, t *tenancy.Tenant, id uint64, err error) {
	deadline := time.Now().Add(closingSlotWait)
	for {
		s.mu.Lock()
		if s.freeSlotLocked() < 0 && s.ending > 0 && !s.closed && time.Now().Before(deadline) {
			freed := s.slotFreed
			s.mu.Unlock()
			wait := time.NewTimer(time.Until(deadline))
			select {
			case <-freed:
			case <-wait.C:
			}
			wait.Stop()
			continue
		}
		slot, t, err = s.takeSlotLocked(tenantID)
		if err == nil {
			s.nextID++
			id = s.nextID
		}
		s.mu.Unlock()
		return slot, t, id, err
	}
}

// freeSlotLocked is the first window slot not in use, or -1.
// Precondition: s.mu must be locked.
func (s *Server) freeSlotLocked() int {
	for i, used := range s.slots {
		if !used {
			return i
		}
	}
	return -1
}

// giveSlotBack returns a slot and a tenant's session that a session could
// not be opened in.
func (s *Server) giveSlotBack(slot int, t *tenancy.Tenant) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.slots[slot] = false
	if t != nil {
		t.Sessions--
		s.tenants.Drop(t)
	}
	s.signalSlotFreedLocked()
}

// sessionEnding notes that a session's connection has ended and the
// session is being let go; the returned function notes that it has been
// (freed, or kept for a resume).
func (s *Server) sessionEnding() (done func()) {
	s.mu.Lock()
	s.ending++
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		s.ending--
		s.signalSlotFreedLocked()
		s.mu.Unlock()
	}
}

// signalSlotFreedLocked wakes the hellos waiting for a slot (takeSlot).
// Precondition: s.mu must be locked.
func (s *Server) signalSlotFreedLocked() {
	close(s.slotFreed)
	s.slotFreed = make(chan struct{})
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
