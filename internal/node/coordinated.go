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
// anyone; the leader key's revision becomes its term. It waits up to three
// lease TTLs for a previous leader to let go.
func lead(cfg Config, role *failover.Node) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*cfg.Coordinator.TTL())
	defer cancel()
	term, err := cfg.Coordinator.Lead(ctx)
	if err != nil {
		return fmt.Errorf("leading group %s before serving: %w", cfg.Coordinator.Group(), err)
	}
	role.Term, role.Coordinated = term, true
	return nil
}

// coordState is what a coordinated node keeps beyond its authority.
type coordState struct {
	// lossRecorded: the group's standby record, as this leader last wrote
	// it, names no standby in sync, so none can win an election with a
	// replica that lacks what this node answers unprotected.
	lossRecorded atomic.Bool
	kick         chan struct{} // publish now (a reply waits for lossRecorded)
	handedOff    atomic.Bool   // a switchover resigned the leader key
}

// guardLease makes the server answer only within this node's lease and,
// once its standby is lost, only after the loss is on record (see
// hypervisor.Server.SetLease).
func (n *Node) guardLease() {
	c := n.cfg.Coordinator
	if c == nil {
		return
	}
	n.srv.SetLease(func() time.Time {
		if n.coord.handedOff.Load() {
			return time.Time{} // gave its leader key away: answers nobody
		}
		return c.LastRenewal().Add(c.TTL() / 2)
	}, n.answerUnprotected)
}

// handOffWithin bounds how long a coordinated primary waits for its
// standby to campaign before a switchover fails (still leading).
const handOffWithin = 2 * time.Second

// coordinatedHandover is a switchover's handover under a coordinator,
// with every guest stopped and the standby holding the whole log: the
// standby is asked to take over (it campaigns), this node resigns once
// the standby's key waits behind its own, and the standby answers with
// the term it won. From the resignation on this node answers no guest;
// if the standby then does not answer, it is fenced.
func (n *Node) coordinatedHandover(r *replication, timeout time.Duration) (uint64, error) {
	type answer struct {
		term uint64
		err  error
	}
	got := make(chan answer, 1)
	go func() { t, err := r.sender.Handover(timeout); got <- answer{t, err} }()
	ctx, cancel := context.WithTimeout(n.ctx, handOffWithin)
	defer cancel()
	if err := n.cfg.Coordinator.HandOff(ctx, r.sender.Status().Standby, func() { n.coord.handedOff.Store(true) }); err != nil {
		return 0, fmt.Errorf("switchover: %w", err)
	}
	a := <-got
	if a.err != nil {
		n.auth.step(failover.Event{Kind: failover.LeaseLost, At: n.cfg.Now()})
		return 0, fmt.Errorf("switchover: resigned, but the standby did not answer (%w); this node is fenced", a.err)
	}
	return a.term, nil
}

// answerUnprotected allows a reply the standby lacks once this leader has
// recorded that its standby is not in sync, stops it once the node no
// longer leads, and meanwhile asks for the record to be written now.
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
		w := &standbyWatch{since: n.cfg.Now()}
		for {
			select {
			case <-n.ctx.Done():
				return
			case <-t.C:
			case <-n.coord.kick:
			}
			n.publish(c, w)
		}
	}()
}

// standbyWatch is what a leader remembers of its standby between rounds.
type standbyWatch struct {
	since   time.Time // the standby was last protecting us (or replication began)
	written coordinator.StandbyRecord
	failed  []string // standbys given up on
}

// publish writes the member record and, while leading, the standby record;
// a standby gone for StandbyLossAfter is replaced from the pool.
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
	var sender *replicate.SenderStatus
	if r := n.replication(); r != nil {
		ss := r.sender.Status()
		sender, m.LagOps = &ss, ss.LagOps
	}
	if err := c.Publish(ctx, m); err != nil {
		n.log.Debug("publishing member record", "err", err)
	}
	if role != failover.Primary || !c.Leader() {
		return
	}
	n.recordStandby(ctx, c, w, term, sender)
}

// recordStandby keeps the group's standby record current and replaces a
// standby that has not protected this leader for StandbyLossAfter.
func (n *Node) recordStandby(ctx context.Context, c *coordinator.Coordinator, w *standbyWatch, term uint64, sender *replicate.SenderStatus) {
	now := n.cfg.Now()
	rec := coordinator.StandbyRecord{Term: term, Since: w.written.Since}
	if sender != nil {
		rec.Addr, rec.InSync = sender.Standby, sender.Protected
	}
	if rec.InSync {
		w.since = now
	}
	if rec.Addr != w.written.Addr || rec.InSync != w.written.InSync || rec.Term != w.written.Term {
		rec.Since = now
		if rec.InSync {
			n.coord.lossRecorded.Store(false) // before the record can name it
		}
		if err := c.SetStandby(ctx, rec); err != nil {
			n.log.Warn("recording the group's standby", "err", err)
			return
		}
		w.written = rec
		n.coord.lossRecorded.Store(!rec.InSync)
	}
	if now.Sub(w.since) < n.cfg.StandbyLossAfter {
		return
	}
	if rec.Addr != "" {
		w.failed = append(w.failed, rec.Addr)
	}
	addr, err := c.PickStandby(ctx, term, w.failed...)
	if err != nil {
		n.log.Warn("standby lost and none to replace it", "after", n.cfg.StandbyLossAfter, "err", err)
		w.since = now // ask the pool again after another StandbyLossAfter
		return
	}
	w.since, w.written = now, coordinator.StandbyRecord{Addr: addr, Term: term, Since: now}
	if err := n.retarget(addr); err != nil {
		n.log.Error("replicating to the pool standby", "standby", addr, "err", err)
	}
}

// retarget replaces the primary's standby with addr: the old link stops,
// and the new standby is resynced from a snapshot.
func (n *Node) retarget(addr string) error {
	n.execMu.Lock()
	defer n.execMu.Unlock()
	if role, _ := n.auth.role(); role != failover.Primary {
		return fmt.Errorf("not primary any more")
	}
	if r := n.replication(); r != nil {
		r.stop()
		r.metrics.unregisterAll()
	}
	n.mu.Lock()
	n.cfg.ReplicateTo = addr
	n.mu.Unlock()
	return n.replicate()
}
