package node

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/vgpuha/vgpuha/failover"
	"github.com/vgpuha/vgpuha/internal/coordinator"
	"github.com/vgpuha/vgpuha/replicate"
)

// lead wins the group's election for a first primary before it serves
// anyone and returns its role: the leader key's revision is its term. It
// waits up to three lease TTLs for a previous leader to let go.
func lead(cfg Config) (*failover.Node, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*cfg.Coordinator.TTL())
	defer cancel()
	term, err := cfg.Coordinator.Lead(ctx)
	if err != nil {
		return nil, fmt.Errorf("leading group %s before serving: %w", cfg.Coordinator.Group(), err)
	}
	return failover.NewCoordinatedPrimary(term, cfg.Coordinator.TTL()), nil
}

// coordState is what a coordinated node keeps beyond its authority.
type coordState struct {
	// lossRecorded: the group's standby record, as this leader last wrote
	// it, names no standby in sync, so none can win an election with a
	// replica that lacks what this node answers unprotected.
	lossRecorded atomic.Bool
	kick         chan struct{} // publish now (a reply waits for the record)
}

// handOffWithin bounds how long a coordinated primary waits for its
// standby to campaign before a switchover fails (still leading).
const handOffWithin = 2 * time.Second

// coordinatedHandover is a switchover's handover under a coordinator,
// with every guest stopped and the standby holding the whole log: the
// standby is asked to take over (it campaigns), this node resigns once
// the standby's key waits behind its own, and the standby answers with
// the term it won. Once it resigned this node is fenced (HandedOff),
// whether or not the standby then answers.
func (n *Node) coordinatedHandover(to *replicate.Sender, timeout time.Duration) (uint64, error) {
	type answer struct {
		term uint64
		err  error
	}
	got := make(chan answer, 1)
	go func() { t, err := to.Handover(timeout); got <- answer{t, err} }()
	ctx, cancel := context.WithTimeout(n.ctx, handOffWithin)
	defer cancel()
	resigned := func() { n.auth.step(failover.Event{Kind: failover.HandedOff, At: n.cfg.Now()}) }
	if err := n.cfg.Coordinator.HandOff(ctx, to.Status().Standby, resigned); err != nil {
		return 0, fmt.Errorf("switchover: %w", err)
	}
	a := <-got
	if a.err != nil {
		return 0, fmt.Errorf("switchover: resigned, but the standby did not answer (%w); this node is fenced", a.err)
	}
	return a.term, nil
}

// answerUnprotected allows a reply no standby holds once this leader has
// recorded that none is in sync, stops it once the node no longer leads,
// and meanwhile asks for the record to be written now (which also lets
// the log forget a standby that left its sync set: replicate.Log.Confirm,
// after which the reply waits for the standbys still in the set).
func (n *Node) answerUnprotected() (allow, stop bool) {
	if n.coord.lossRecorded.Load() {
		return true, false
	}
	if role, _ := n.auth.role(); role != failover.Primary || n.ctx.Err() != nil {
		return false, true
	}
	select {
	case n.coord.kick <- struct{}{}:
	default:
	}
	return false, false
}

// coordinate feeds the coordinator's events to the authority and runs the
// node's side of the group records: its member record, and while it
// leads, the group's standby record and the replacement of a lost
// standby from the pool.
func (n *Node) coordinate() {
	c := n.cfg.Coordinator
	if c == nil {
		return
	}
	c.Start(n.auth.step)
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		every := min(c.TTL()/10, 100*time.Millisecond)
		t := time.NewTicker(every)
		defer t.Stop()
		w := &standbyWatch{caughtUp: map[string]time.Time{}}
		for {
			select {
			case <-n.ctx.Done():
				return
			case <-t.C:
			case <-n.coord.kick:
			}
			n.reportCovered(w)
			n.publish(c, w)
		}
	}()
}

// standbyWatch is what a leader remembers of its standbys between rounds.
type standbyWatch struct {
	// caughtUp: each standby was last caught up (or first seen) then.
	caughtUp map[string]time.Time
	written  coordinator.StandbyRecord
	failed   []string // standbys given up on
	adopted  bool     // the record's standbys were taken over (adoptStandbys)
	covered  int      // what the authority was last told: 1 covered, -1 not, 0 nothing yet
}

// reportCovered tells the authority of a primary (serving or suspended)
// whether a standby in sync could take over from it; a suspended primary
// gives up only then (failover.Node.SuspendLimit).
func (n *Node) reportCovered(w *standbyWatch) {
	r := n.replication()
	if role, _ := n.auth.role(); r == nil || (role != failover.Primary && role != failover.Suspended) {
		return
	}
	covered := -1
	if r.log.Status().InSyncCount > 0 {
		covered = 1
	}
	if covered != w.covered {
		w.covered = covered
		n.auth.step(failover.Event{Kind: failover.Covered, InSync: covered > 0})
	}
}

// publish writes the member record and, while leading, the standby record;
// a standby not caught up for StandbyLossAfter is replaced from the pool,
// and the pool fills the standbys up to k.
func (n *Node) publish(c *coordinator.Coordinator, w *standbyWatch) {
	ctx, cancel := context.WithTimeout(n.ctx, c.TTL()/2)
	defer cancel()
	role, term := n.auth.role()
	m := coordinator.Member{Role: role.String(), Term: term, Addr: c.Advertise(), Serving: role == failover.Primary, Capacity: 1}
	if n.agent != nil && role == failover.Standby {
		st := n.agent.Receiver.Status()
		m.Attached, m.InSync = st.Connected, st.InSync
	}
	if role == failover.Primary {
		m.Addr, m.Capacity = "", 0
	}
	r := n.replication()
	if r != nil {
		m.LagOps = r.log.Status().LagOps
	}
	if err := c.Publish(ctx, m); err != nil {
		n.log.Debug("publishing member record", "err", err)
	}
	if role != failover.Primary || !c.Leader() || r == nil {
		return
	}
	if !w.adopted {
		if w.adopted = n.adoptStandbys(ctx, c, r); !w.adopted {
			return
		}
	}
	if n.recordStandbys(ctx, c, w, r, term) {
		n.replaceStandbys(ctx, c, w, r)
	}
}

// recordStandbys keeps the group's standby record current: every standby
// streamed to, and which are in sync. Once written, the log may forget
// standbys that left its sync set and are no longer named in sync. It
// reports whether the record is current.
func (n *Node) recordStandbys(ctx context.Context, c *coordinator.Coordinator, w *standbyWatch, r *replication, term uint64) bool {
	now := n.cfg.Now()
	rec := coordinator.StandbyRecord{Term: term, MinInSync: max(n.cfg.MinInSync, 1), Since: w.written.Since}
	for _, s := range r.senders() {
		st := s.Status()
		rec.Standbys = append(rec.Standbys, coordinator.RecordedStandby{Addr: st.Standby, InSync: st.InSync})
		if st.Protected { // caught up (in the sync set or beyond k)
			w.caughtUp[st.Standby] = now
		}
	}
	if rec.Same(w.written) {
		r.log.Confirm(rec.InSyncAddrs()) // a departure since the last write that the record already leaves out
		return true
	}
	rec.Since = now
	if len(rec.InSyncAddrs()) > 0 {
		n.coord.lossRecorded.Store(false) // before the record can name one
	}
	if err := c.SetStandby(ctx, rec); err != nil {
		n.log.Warn("recording the group's standbys", "err", err)
		return false
	}
	w.written = rec
	n.coord.lossRecorded.Store(len(rec.InSyncAddrs()) == 0)
	r.log.Confirm(rec.InSyncAddrs())
	return true
}

// replaceStandbys replaces each standby that has not been caught up for
// StandbyLossAfter with one from the group's pool, and takes standbys
// from the pool until k are streamed to.
func (n *Node) replaceStandbys(ctx context.Context, c *coordinator.Coordinator, w *standbyWatch, r *replication) {
	now := n.cfg.Now()
	addrs := r.addrs()
	for _, addr := range addrs {
		since, seen := w.caughtUp[addr]
		if !seen {
			w.caughtUp[addr] = now
		}
		if !seen || now.Sub(since) < n.cfg.StandbyLossAfter {
			continue
		}
		pick, err := c.PickStandby(ctx, append(w.failed, addrs...)...)
		if err != nil {
			n.log.Warn("standby lost and none to replace it", "standby", addr, "after", n.cfg.StandbyLossAfter, "err", err)
			w.caughtUp[addr] = now // ask the pool again after another StandbyLossAfter
			continue
		}
		w.failed = append(w.failed, addr)
		delete(w.caughtUp, addr)
		w.caughtUp[pick] = now
		n.swapStandby(r, addr, pick)
	}
	for len(r.addrs()) < max(n.cfg.MinInSync, 1) {
		pick, err := c.PickStandby(ctx, append(w.failed, r.addrs()...)...)
		if err != nil {
			return // fewer than k: the record says so; the pool is asked again next round
		}
		w.caughtUp[pick] = now
		if err := n.addStandby(r, pick); err != nil {
			n.log.Error("replicating to the pool standby", "standby", pick, "err", err)
			return
		}
	}
}

// swapStandby replaces the standby at old with the one at pick (resynced
// from a snapshot).
func (n *Node) swapStandby(r *replication, old, pick string) {
	n.execMu.Lock()
	defer n.execMu.Unlock()
	if role, _ := n.auth.role(); role != failover.Primary {
		return
	}
	r.removeStandby(old)
	if err := n.addStandby(r, pick); err != nil {
		n.log.Error("replicating to the pool standby", "standby", pick, "err", err)
	}
}

// adoptStandbys makes a new leader stream to every other standby the
// group's record lists (they followed the old primary; now they follow
// this one, resynced from it), before it first writes the record. It
// reports whether the record was read.
func (n *Node) adoptStandbys(ctx context.Context, c *coordinator.Coordinator, r *replication) bool {
	rec, err := c.Standbys(ctx)
	if err != nil {
		n.log.Warn("reading the group's standbys", "err", err)
		return false
	}
	for _, s := range rec.Standbys {
		if s.Addr == c.Advertise() {
			continue
		}
		if err := n.addStandby(r, s.Addr); err != nil {
			n.log.Error("replicating to the group's standby", "standby", s.Addr, "err", err)
		}
	}
	return true
}
