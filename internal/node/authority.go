package node

import (
	"context"
	"sync"
	"time"

	"github.com/vgpuha/vgpuha/failover"
)

// authority runs the node's role state machine (failover.Node, the
// golden-tested logic) at run time: everything that bears on the role
// (the primary heard, the replica in sync, a peer's term, a switchover
// request, time passing) is fed to it as an event, and the actions it
// returns (promote, fence) are carried out one at a time on the
// authority's own goroutine, never on the goroutine that reported the
// event: a receiver reporting a heartbeat must never wait for a promotion
// that waits for that receiver to stop.
//
// It is also the one writer of the role everything else acts on: before
// it carries out actions it pushes the node's view (role, term, the
// leader's term, why) through push, which hands it to the server, the log
// and the replication receiver (Node.pushRole). Nothing else sets a term
// or fences.
//
// It implements standby.Roles (for the replication receiver) and
// replicate.Protected's PeerTerm (for the sender).
type authority struct {
	now     func() time.Time
	execute func(failover.Action)
	push    func(view)
	kick    chan struct{}

	mu        sync.Mutex
	node      *failover.Node
	pending   []failover.Action
	lastHeard time.Time
	why       string // the reason of the last action that stopped serving

	pushMu sync.Mutex // held while pushing: one view at a time, in order
	pushed view
}

// view is the node's role as its authority decided it.
type view struct {
	role       failover.Role
	term       uint64
	leaderTerm uint64 // the newest leader its coordinator reported
	why        string // why it stopped serving, while it does not serve
}

// tickEvery is how often a standby asks its detector.
const tickEvery = 5 * time.Millisecond

// init sets the authority up and pushes the node's first view.
func (a *authority) init(n *failover.Node, now func() time.Time, execute func(failover.Action), push func(view)) {
	a.node, a.now, a.execute, a.push = n, now, execute, push
	a.kick = make(chan struct{}, 1)
	a.pushed = view{role: failover.Standby}
	a.publish()
}

// current is the view as decided so far.
func (a *authority) current() view {
	a.mu.Lock()
	defer a.mu.Unlock()
	v := view{role: a.node.Role(), term: a.node.Term(), leaderTerm: a.node.LeaderTerm()}
	if v.role == failover.Fenced || v.role == failover.Suspended {
		v.why = a.why // why it stopped serving; nothing while it serves or stands by
	}
	return v
}

// publish pushes the current view if it changed since the last push.
func (a *authority) publish() {
	a.pushMu.Lock()
	defer a.pushMu.Unlock()
	if v := a.current(); v != a.pushed {
		a.pushed = v
		a.push(v)
	}
}

// stepLocked feeds one event and queues the actions it yields. It returns the
// node's term after the event.
// Precondition: a.mu must be locked.
func (a *authority) stepLocked(e failover.Event) (uint64, int) {
	acts := a.node.Step(e)
	for _, act := range acts {
		if act.Kind == failover.Fence || act.Kind == failover.Suspend {
			a.why = act.Why
		}
	}
	a.pending = append(a.pending, acts...)
	if len(acts) > 0 {
		select {
		case a.kick <- struct{}{}:
		default:
		}
	}
	return a.node.Term(), len(acts)
}

func (a *authority) step(e failover.Event) {
	a.mu.Lock()
	a.stepLocked(e)
	a.mu.Unlock()
}

// run ticks the detector, pushes each new view and carries out queued
// actions (after the view they led to) until ctx ends.
func (a *authority) run(ctx context.Context) {
	t := time.NewTicker(tickEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			a.step(failover.Event{Kind: failover.Tick, At: a.now()})
		case <-a.kick:
		}
		a.drain()
	}
}

// drain pushes the view the queued actions led to, then carries them out.
func (a *authority) drain() {
	a.mu.Lock()
	acts := a.pending
	a.pending = nil
	a.mu.Unlock()
	a.publish()
	for _, act := range acts {
		a.execute(act)
	}
}

func (a *authority) role() (failover.Role, uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.node.Role(), a.node.Term()
}

func (a *authority) heardAt() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lastHeard
}

// Heard implements standby.Roles: the primary was heard under term.
func (a *authority) Heard(term uint64) {
	now := a.now()
	a.mu.Lock()
	a.lastHeard = now
	a.stepLocked(failover.Event{Kind: failover.Heard, At: now, Term: term})
	a.mu.Unlock()
}

// Synced implements standby.Roles.
func (a *authority) Synced(inSync bool) {
	a.step(failover.Event{Kind: failover.Synced, InSync: inSync})
}

// HandOver implements standby.Roles: the primary asks this node to take
// over; the authority decides, and the new term is returned. Coordinated,
// the node campaigns and the term is the one it wins once the primary
// resigned (see awaitElection).
func (a *authority) HandOver() (uint64, bool) {
	a.mu.Lock()
	term, n := a.stepLocked(failover.Event{Kind: failover.HandOver})
	coordinated := a.node.Coordinated
	a.mu.Unlock()
	if n == 0 || !coordinated {
		return term, n > 0
	}
	return a.awaitElection(handOverWait)
}

// handOverWait bounds how long a coordinated standby waits for the
// election a switchover started: longer than its primary waits for the
// campaign before resigning (handOffWithin), so that it is never the
// standby that gives up first.
const handOverWait = 5 * time.Second

// awaitElection waits until the authority made this node the primary (on
// ElectionWon; the promotion itself runs later, on the authority's
// goroutine, and may wait for the caller's link to end) and returns its
// term. At timeout the campaign is withdrawn.
func (a *authority) awaitElection(d time.Duration) (uint64, bool) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		switch role, term := a.role(); role {
		case failover.Primary:
			return term, true
		case failover.Fenced:
			return 0, false
		}
		time.Sleep(tickEvery)
	}
	a.step(failover.Event{Kind: failover.CampaignAbandoned}) // withdraws the waiting key
	return 0, false
}

// PeerTerm implements replicate.Protected: a standby answered with its
// term.
func (a *authority) PeerTerm(term uint64) {
	a.step(failover.Event{Kind: failover.PeerTerm, Term: term})
}

// LeaderElected: the coordinator reports the group's leader under term.
func (a *authority) LeaderElected(term uint64) {
	a.step(failover.Event{Kind: failover.LeaderElected, Term: term})
}
