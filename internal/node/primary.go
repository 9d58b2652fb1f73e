package node

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpuha/vgpuha/failover"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/replicate"
	"github.com/vgpuha/vgpuha/replicate/verify"
)

// Promotion records one takeover.
type Promotion struct {
	Term           uint64    `json:"term"`
	LastHeard      time.Time `json:"last_heard"`
	Detected       time.Time `json:"detected"`
	Serving        time.Time `json:"serving"`
	DetectionMS    float64   `json:"detection_ms"` // silence before the detector fired
	PromotionMS    float64   `json:"promotion_ms"` // detection to serving guests
	DiscardedEpoch int       `json:"discarded_epoch_records"`
}

// becomePrimary makes this node a primary under the term its authority
// pushed before (pushRole): it replicates to the configured standbys
// (before any guest is served) and serves guests. Both the first primary
// and a promoted standby are built here.
func (n *Node) becomePrimary() error {
	if len(n.cfg.ReplicateTo) > 0 || n.cfg.Coordinator != nil {
		if err := n.replicate(n.cfg.ReplicateTo); err != nil {
			if n.agent == nil {
				return err
			}
			n.log.Error("cannot replicate to the next standby; serving unprotected", "err", err)
		}
	}
	err := n.serveGuests()
	if err == nil || n.agent == nil {
		return err
	}
	// A promoted standby must not strand its guests over an endpoint that
	// is busy for a moment: it keeps trying until it listens or stops.
	n.log.Error("cannot listen for guests after promotion; retrying", "endpoint", n.cfg.GuestListen, "err", err)
	n.mu.Lock()
	n.guestListenErr = err
	n.mu.Unlock()
	go n.retryServeGuests()
	return nil
}

// retryServeGuests tries to listen for guests every 100 ms until it does or
// the node stops.
func (n *Node) retryServeGuests() {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
		err := n.serveGuests()
		n.mu.Lock()
		n.guestListenErr = err
		n.mu.Unlock()
		if err == nil {
			n.log.Warn("serving guests after promotion, at last", "endpoint", n.cfg.GuestListen)
			return
		}
	}
}

// replicate starts streaming to every standby in targets; each is brought
// up to date from a snapshot or the log. Coordinated, the node replicates
// even without one: the group's other standbys (adoptStandbys) and the
// pool's join the log later.
func (n *Node) replicate(targets []string) error {
	lg := replicate.NewLog(n.cfg.MaxLagBytes)
	if n.cfg.ResyncBudgetBytes > 0 {
		lg.SetResyncBudget(n.cfg.ResyncBudgetBytes)
	}
	if n.cfg.ResyncStall > 0 {
		lg.SetResyncStall(n.cfg.ResyncStall)
	}
	lg.SetResyncGuestShare(n.cfg.ResyncGuestShare)
	if n.cfg.ReadCheckBytes != 0 {
		lg.SetReadCheckMin(max(n.cfg.ReadCheckBytes, 0)) // negative: none
	}
	if n.cfg.SessionShareBytes != 0 {
		lg.SetSessionShare(n.cfg.SessionShareBytes) // negative: none
	}
	lg.SetMinInSync(n.cfg.MinInSync)
	if ha, ok := gpu.Host(n.cfg.Backend).(gpu.HostAllocator); ok { // page-locked for every GPU (CUDA: portable)
		// A guest's bulk copy goes to the device from its log buffer:
		// page-locked, for as many as may be unapplied or in flight.
		lg.SetHostBuffers(ha.AllocHost, int(n.cfg.MaxLagBytes)+hostBuffersInFlight)
	}
	if n.cfg.Coordinator != nil {
		lg.RecordDepartures()
	}
	r := &replication{log: lg}
	n.srv.Replicate(lg, n.cfg.Mode) // before a sender can ask for a snapshot
	n.mu.Lock()
	n.repl = r
	n.mu.Unlock()
	for _, addr := range targets {
		if err := n.addStandby(r, addr); err != nil {
			return err
		}
	}
	return n.registerLogMetrics(lg)
}

// hostBuffersInFlight is the page-locked log memory a primary keeps
// beyond its lag bound: a guest's large copy has a few pieces in flight
// that the standby has not yet received.
const hostBuffersInFlight = 128 << 20

// registerLogMetrics exports the sync set's size and k (a node becomes
// primary once).
func (n *Node) registerLogMetrics(lg *replicate.Log) error {
	for _, c := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vgpuha_replication_in_sync_standbys", Help: "Standbys in the sync set that hold every acknowledged op."},
			func() float64 { return float64(lg.Status().InSyncCount) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vgpuha_replication_min_in_sync", Help: "In-sync standbys the commit rule waits for (k)."},
			func() float64 { return float64(lg.Status().MinInSync) }),
	} {
		if err := n.cfg.Registry.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// protected is what the sender needs of its node: the server's snapshot,
// and the authority's term (heartbeats must never wait for the server,
// which a switchover holds stopped while it waits for the standby) and
// decision on a peer's term.
type protected struct{ n *Node }

func (p protected) Snapshot() (replicate.Snapshot, error) { return p.n.srv.Snapshot() }
func (p protected) PeerTerm(term uint64)                  { p.n.auth.PeerTerm(term) }

func (p protected) Term() uint64 {
	_, term := p.n.auth.role()
	return term
}

// execute carries out one decision of the role authority.
func (n *Node) execute(act failover.Action) {
	n.execMu.Lock()
	defer n.execMu.Unlock()
	c := n.cfg.Coordinator
	switch act.Kind {
	case failover.Campaign:
		c.Campaign()
	case failover.Resign:
		c.Resign()
	case failover.Promote:
		if err := n.promote(act.Term); err != nil {
			n.log.Error("promotion failed", "err", err)
		}
	case failover.Fence: // the server was fenced by the view pushed before
		n.stoppedServing()
		if r := n.replication(); r != nil {
			r.stop() // a fenced node has nothing left to protect
		}
		if c != nil {
			c.Resign()
		}
		n.log.Warn("fenced: stopped serving guests for good", "term", act.Term, "why", act.Why)
	case failover.Suspend, failover.Resume, failover.Relead:
		n.executeLease(act)
	}
}

// executeLease carries out a coordinated primary's lease decisions:
// suspend (its server already answers nobody past LeadsUntil; its log and
// links stay), resume under a term, or lead again after its lease expired.
func (n *Node) executeLease(act failover.Action) {
	switch act.Kind {
	case failover.Suspend:
		n.stoppedServing()
		n.log.Warn("suspended: answering no guest until this node proves it still leads", "term", act.Term, "why", act.Why)
	case failover.Resume:
		n.mu.Lock()
		suspended := n.cfg.Now().Sub(n.servingUntil)
		n.servingFrom, n.servingUntil = n.cfg.Now(), time.Time{}
		n.mu.Unlock()
		n.log.Warn("serving guests again", "term", act.Term, "suspended_ms", suspended.Milliseconds(), "why", act.Why)
	case failover.Relead:
		n.log.Warn("leading the group again if no node led since its term", "term", act.Term, "why", act.Why)
		n.cfg.Coordinator.Relead(act.Term)
	}
}

// stoppedServing notes when this node stopped serving guests.
func (n *Node) stoppedServing() {
	n.mu.Lock()
	if n.servingUntil.IsZero() {
		n.servingUntil = n.cfg.Now()
	}
	n.mu.Unlock()
}

// promote makes this standby the primary under term: it stops taking the
// old primary's stream (and tells it so if it comes back), drops an
// uncommitted epoch, and serves guests with every session, handle and
// device address intact.
func (n *Node) promote(term uint64) error {
	detected := n.cfg.Now()
	lastHeard := n.auth.heardAt()
	applied := n.agent.Receiver.Status().Applied
	dropped := n.agent.Receiver.DiscardEpoch() // the receiver stopped applying when the view was pushed
	if err := n.becomePrimary(); err != nil {
		return fmt.Errorf("serving guests after promotion: %w", err)
	}
	p := &Promotion{Term: term, LastHeard: lastHeard, Detected: detected, Serving: n.cfg.Now(), DiscardedEpoch: dropped}
	p.DetectionMS = float64(detected.Sub(lastHeard).Microseconds()) / 1000
	p.PromotionMS = float64(p.Serving.Sub(detected).Microseconds()) / 1000
	n.mu.Lock()
	n.promotion = p
	n.mu.Unlock()
	n.log.Warn("promoted to primary", "term", term, "silence_ms", p.DetectionMS, "promotion_ms", p.PromotionMS,
		"guest_endpoint", n.cfg.GuestListen, "applied_seq", applied, "discarded_epoch_records", dropped)
	return nil
}

// Promoted returns the takeover, if there was one.
func (n *Node) Promoted() *Promotion {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.promotion
}

func (n *Node) replication() *replication {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.repl
}

// Sender is the primary's sender to its first standby (nil when not
// replicating).
func (n *Node) Sender() *replicate.Sender {
	if r := n.replication(); r != nil {
		if ss := r.senders(); len(ss) > 0 {
			return ss[0]
		}
	}
	return nil
}

// Senders are the primary's senders, one per standby, in priority order.
func (n *Node) Senders() []*replicate.Sender {
	if r := n.replication(); r != nil {
		return r.senders()
	}
	return nil
}

// Log is the primary's replication log (nil when not replicating).
func (n *Node) Log() *replicate.Log {
	if r := n.replication(); r != nil {
		return r.log
	}
	return nil
}

// VerifyOptions choose what verify does beyond comparing checksums.
type VerifyOptions struct {
	// Repair copies every repairable diverged allocation from the primary
	// to the standby.
	Repair bool
	// Apertures also compares each aperture's file byte by byte with its
	// device copy on the primary and on the standby.
	Apertures bool
}

// Verify compares every object on this primary and its standby at one log
// position (see VerifyOptions).
func (n *Node) Verify(opts VerifyOptions, timeout time.Duration) (verify.Report, error) {
	r := n.replication()
	if r == nil || r.first() == nil {
		return verify.Report{}, errNotReplicating
	}
	point := func(id uint64) []verify.ObjectSum { return n.srv.VerifyPoint(id, opts.Apertures) }
	rep, err := r.first().Verify(point, timeout)
	if err != nil || !opts.Repair || rep.Match {
		return rep, err
	}
	for _, m := range rep.Mismatches {
		if m.Repairable && n.srv.Repair(m.Session, m.Object) == nil {
			rep.Repaired++
		}
	}
	return rep, nil
}

// Switchover hands the primary role to the first in-sync standby with
// nothing lost and returns how long guests were stopped and the standby's
// new term. The other standbys follow the new primary.
func (n *Node) Switchover(timeout time.Duration) (time.Duration, uint64, error) {
	r := n.replication()
	if r == nil || r.first() == nil {
		return 0, 0, errNotReplicating
	}
	var term uint64
	pause, err := n.srv.Switchover(func() (hypervisor.Role, error) {
		var err error
		to := r.first()
		if n.cfg.Coordinator != nil {
			term, err = n.coordinatedHandover(to, timeout)
		} else {
			term, err = to.Handover(timeout)
		}
		if err == nil {
			n.auth.PeerTerm(term) // the authority fences this node
		}
		return n.serverRole(n.auth.current()), err
	})
	return pause, term, err
}

// CutEpoch ends an epoch (epoch mode) and reports whether the standby
// holds it.
func (n *Node) CutEpoch() (uint64, bool, error) {
	r := n.replication()
	if r == nil {
		return 0, false, errNotReplicating
	}
	e, durable := r.log.CutEpoch()
	return e, durable, nil
}

// IsNotReplicating reports whether err means the node has no standby link.
func IsNotReplicating(err error) bool { return errors.Is(err, errNotReplicating) }

// pushRole is the one setter of the node's role: the authority hands it
// every new view, and it tells the server (term, fence, lease; a standby's
// replica server takes its role once it is no longer a standby) and the
// replication receiver (stop applying once the node leads or is fenced;
// refuse streams below the newest leader's term).
func (n *Node) pushRole(v view) {
	if v.role != failover.Standby {
		n.srv.SetRole(n.serverRole(v))
	}
	if n.agent == nil {
		return
	}
	if v.role != failover.Standby {
		n.agent.Receiver.Fence(v.term)
	}
	n.agent.Receiver.RefuseBelow(v.leaderTerm)
}

// serverRole is v as the hypervisor server takes it. A coordinated node
// answers guests only within its lease and, once its standby is lost,
// only after the loss is on record (answerUnprotected).
func (n *Node) serverRole(v view) hypervisor.Role {
	r := hypervisor.Role{Term: v.term, Fenced: v.role == failover.Fenced, Why: v.why}
	if c := n.cfg.Coordinator; c != nil {
		r.Lease, r.Unprotected = c.LeadsUntil, n.answerUnprotected // LeadsUntil is zero while suspended or releading
	}
	return r
}
