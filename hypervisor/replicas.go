package hypervisor

import (
	"fmt"
	"time"

	"github.com/vgpuha/vgpuha/hypervisor/aperture"
	"github.com/vgpuha/vgpuha/hypervisor/exactlyonce"
	"github.com/vgpuha/vgpuha/hypervisor/objects"
	"github.com/vgpuha/vgpuha/hypervisor/replica"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// The node's sessions as a standby keeps them (replica.Sessions): package
// replica applies the primary's log to them, each through the same
// handlers a guest's requests run (replicaView), so that a standby checks
// the stream exactly as the primary checked the guest.

// slowReplicaOpen is how long opening a replica session may take before
// the standby says so: its log, and in commit mode its primary's guests,
// wait meanwhile.
const slowReplicaOpen = time.Second

// OpenReplica implements replica.Sessions: a standby's copy of a primary
// session, asking the backend for the same window base.
func (s *Server) OpenReplica(id, base uint64, body []byte) error {
	open, err := replica.DecodeSessionOpen(body)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.sessions[id] != nil {
		s.mu.Unlock()
		return fmt.Errorf("session %d is already open", id)
	}
	// Once promoted, this node opens sessions of its own: their ids and
	// windows must not collide with the replicated ones.
	s.nextID = max(s.nextID, id)
	slot := s.replicaSlot(base)
	if slot < 0 {
		s.mu.Unlock()
		return fmt.Errorf("no free session slot for session %d", id)
	}
	s.slots[slot] = true
	t := s.tenants.Get(open.Tenant) // counted as on the primary, not limited
	if t != nil {
		t.Sessions++
	}
	s.mu.Unlock()
	start := time.Now()
	sess, err := s.newSession(id, slot, open, base, false) // placed by this node's own policy
	if err != nil {
		s.giveSlotBack(slot, t)
		return err
	}
	// Launches pipeline as on the primary (the guest's attach did it
	// there): unpipelined, a launch into a GPU worker is a round trip
	// between processes, and a standby applying sixteen guests' logs spent
	// its time in those.
	sess.mu.Lock()
	sess.pipeline()
	sess.mu.Unlock()
	if took := time.Since(start); took >= slowReplicaOpen {
		// The log waits behind it, and in commit mode so do the guests.
		s.log.Info("replica session opened slowly: its GPU context was not ready", "session", id, "gpu", sess.dev.index, "took", took.Round(time.Millisecond))
	}
	if sess.mem.Translated() {
		s.log.Warn("replica window not at the primary's base; translating addresses", "session", id,
			"want", fmt.Sprintf("%#x", base), "got", fmt.Sprintf("%#x", base+sess.mem.Delta()))
	}
	return nil
}

// replicaSlot is the slot of the primary's window at base (the same one,
// when the windows are laid out alike), or else the first free slot.
// Precondition: s.mu must be locked.
func (s *Server) replicaSlot(base uint64) int {
	if base >= s.cfg.WindowBase && (base-s.cfg.WindowBase)%s.cfg.WindowSize == 0 {
		if i := (base - s.cfg.WindowBase) / s.cfg.WindowSize; i < uint64(len(s.slots)) && !s.slots[i] {
			return int(i)
		}
	}
	for i, used := range s.slots {
		if !used {
			return i
		}
	}
	return -1
}

// Replica implements replica.Sessions.
func (s *Server) Replica(id uint64) replica.Session {
	s.mu.Lock()
	sess := s.sessions[id]
	s.mu.Unlock()
	if sess == nil {
		return nil
	}
	return replicaView{sess}
}

// Replicas implements replica.Sessions.
func (s *Server) Replicas() []replica.Session {
	all := s.sessionList()
	views := make([]replica.Session, len(all))
	for i, sess := range all {
		views[i] = replicaView{sess}
	}
	return views
}

// CloseReplica implements replica.Sessions.
func (s *Server) CloseReplica(r replica.Session) { s.closeSession(r.(replicaView).s) }

// ReceiveImage implements replica.Sessions.
func (s *Server) ReceiveImage(body []byte) error { return s.images.Receive(body) }

// ResetImages implements replica.Sessions.
func (s *Server) ResetImages() { s.images.ResetReceived() }

// ReplicaMetrics implements replica.Sessions.
func (s *Server) ReplicaMetrics() replica.Metrics {
	return replica.Metrics{ReadBackRepairs: s.metrics.readBackRepairs, GlobalsElsewhere: s.metrics.globalsElsewhere, Panics: s.metrics.panics}
}

// replicaView is a session as package replica drives it: its lock, its
// rooms and its handler table. It holds nothing of its own.
type replicaView struct{ s *Session }

func (v replicaView) Lock()                         { v.s.mu.Lock() }
func (v replicaView) Unlock()                       { v.s.mu.Unlock() }
func (v replicaView) ID() uint64                    { return v.s.id }
func (v replicaView) Closed() bool                  { return v.s.closed }
func (v replicaView) Memory() replica.Memory        { return v.s.mem }
func (v replicaView) Objects() *objects.Set         { return v.s.objs }
func (v replicaView) Once() *exactlyonce.Table      { return &v.s.once }
func (v replicaView) Verify() *aperture.Comparisons { return &v.s.verifyMMIO }
func (v replicaView) Idle()                         { v.s.Idle() }

// Run implements replica.Session: op's handler, as a guest's request runs
// it once admitted.
func (v replicaView) Run(op abi.Opcode, req abi.Body) (abi.Body, error) {
	run := opTable[op]
	if run == nil {
		return nil, fail(abi.StatusInvalidValue, "%s is not a session request", op)
	}
	return run(v.s, req)
}

// MarkUnsafe implements replica.Session.
func (v replicaView) MarkUnsafe(why string) string {
	if v.s.unsafe == "" {
		v.s.unsafe = why
	}
	return v.s.unsafe
}
