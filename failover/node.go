package failover

import (
	"fmt"
	"time"
)

// Role is what a node does.
type Role int

// Roles.
const (
	// Standby applies a primary's stream and watches its heartbeats.
	Standby Role = iota
	// Primary serves guests.
	Primary
	// Fenced: a node that learned of a newer term; it serves nothing.
	Fenced
	// Suspended: a coordinated primary that could not renew its lease in
	// time. It answers no guest but keeps its log and its standbys' links
	// (their heartbeats go on, so a standby does not take over while etcd
	// alone stalls) until it proves it still leads (Resume) or learns that
	// another node does (Fence).
	Suspended
)

func (r Role) String() string {
	switch r {
	case Standby:
		return "standby"
	case Primary:
		return "primary"
	case Suspended:
		return "suspended"
	}
	return "fenced"
}

// EventKind says what a node observed.
type EventKind int

// Events a node is fed. The zero kind is invalid.
const (
	_ EventKind = iota
	// Heard: the primary was heard from (a heartbeat or a record) at At,
	// under Term (0 when the message carries none). Any message proves the
	// primary alive; the detector knows the primary's heartbeat period and
	// learns no shorter interval from a burst of records (PhiAccrual).
	Heard
	// Synced: the standby's replica became a complete copy (InSync) or
	// stopped being one (a resync began).
	Synced
	// Tick: time passed; a standby asks its detector at At.
	Tick
	// PeerTerm: another node reported Term (a promoted standby answering
	// a returning primary, or a switchover's new term).
	PeerTerm
	// HandOver: the primary asks this standby to take over now (a planned
	// switchover; it has stopped its guests and drained its log).
	HandOver
	// LeaseLost: a coordinated primary could not renew its lease for so
	// long that the lease might expire soon (its coordinator's clock-safe
	// margin ran out); it must stop serving before another node can win.
	LeaseLost
	// ElectionWon: a coordinated standby won its group's election; Term is
	// the fencing token the coordinator derived from the leader key.
	ElectionWon
	// CampaignEnded: a coordinated standby's campaign ended without a
	// usable win (the coordinator refused it or gave up); it may campaign
	// again when its detector next suspects the primary.
	CampaignEnded
	// LeaseRegained: a suspended primary's coordinator proved that this
	// node leads under Term: its lease was renewed before etcd expired it
	// and its leader key is still the group's (Term unchanged), or, after
	// the lease expired, it won the election again and the group's term
	// record still named this node's term when it wrote Term over it
	// (nobody led in between).
	LeaseRegained
	// LeaseExpired: etcd says the node's lease is gone (its leader key with
	// it); the coordinator holds a new lease.
	LeaseExpired
	// Deposed: the node no longer leads: the group's term record names
	// Term, another node's, or the node gave its leader key away.
	Deposed
	// Covered: a primary learned whether a standby in sync could take over
	// from it (InSync).
	Covered
	// HandedOff: a coordinated primary gave its leader key to a standby
	// (a switchover); from then on it must not serve, whether or not the
	// standby takes over.
	HandedOff
	// LeaderElected: the coordinator reports that the group's leader holds
	// Term (a watch on the election). A standby applies no stream below
	// it; a primary below it is no longer the leader.
	LeaderElected
	// CampaignAbandoned: the node stopped waiting for a campaign it was
	// asked to run (a switchover's election that did not come in time); it
	// withdraws from the election.
	CampaignAbandoned
)

// Event is one observation.
type Event struct {
	Kind   EventKind
	At     time.Time
	Term   uint64
	InSync bool
}

// ActionKind says what the node's owner must do.
type ActionKind int

// Actions a node asks for. The zero kind is invalid.
const (
	_ ActionKind = iota
	// Promote: become the primary under Term (stop taking the old
	// primary's stream, serve guests, stamp Term on every record).
	Promote
	// Fence: stop serving guests for good; a node with Term took over
	// (or, coordinated, this node's lease may no longer be trusted).
	Fence
	// Campaign: a coordinated standby asks its coordinator to run in the
	// group's election; a win comes back as ElectionWon.
	Campaign
	// Resign: withdraw from the election, or give up a leadership this
	// node must not use (it lost its complete replica, or the token is
	// not above a term it already knows).
	Resign
	// Suspend: stop answering guests (a coordinated primary's lease may be
	// lost), keeping the log and the standbys' links.
	Suspend
	// Resume: a suspended primary serves again, under Term.
	Resume
	// Relead: ask the coordinator to lead the group again, provided no
	// node led after Term (its lease expired; see LeaseRegained).
	Relead
	// Follow: a standby applies no stream below Term from now on (its
	// coordinator reported a leader under Term).
	Follow
)

// Action is one decision for the node's owner to carry out.
type Action struct {
	Kind ActionKind
	Term uint64
	// Why says what led to the action, for the node's log.
	Why string
}

// Node is one node's role logic: the only place that decides a node's role
// and term. It is deterministic and free of I/O, like etcd-io/raft's Node:
// its owner feeds it what it observes with Step and carries out the actions
// Step returns (the server, the replication receiver and the log are told
// the outcome, they never decide). Golden scenario tests drive two of them
// through crashes, freezes and partitions (testdata/roles).
//
// A coordinator (an external lease and election, Coordinated set) plugs
// in as more event kinds: a lease lost suspends the primary (it answers
// no guest but keeps its links) until its coordinator proves it still
// leads or leads again with nobody in between (lease.go), and a standby that
// suspects its primary no longer promotes itself: it asks to Campaign and
// promotes only on ElectionWon, under the election's token, which must be
// above every term it knows. A switchover (HandOver) also moves the
// leadership only through the coordinator: the standby campaigns, the
// primary resigns, and the standby promotes on ElectionWon.
type Node struct {
	role   Role
	term   uint64
	InSync bool // a standby holds a complete replica: it may take over
	det    Detector
	// leaderTerm: the newest leader's term the coordinator reported
	// (LeaderElected); a standby applies no stream below it.
	leaderTerm uint64

	// Coordinated: a coordinator owns leadership (see above).
	Coordinated bool
	campaigning bool
	// SuspendLimit: a suspended primary that a standby in sync covers
	// gives up (fences) once suspended this long, so that the standby
	// takes over from a primary cut from etcd; one no standby covers never
	// gives up (it holds the only copy of its guests' state). 0: never.
	SuspendLimit time.Duration
	covered      bool      // a standby in sync could take over (Covered)
	suspendedAt  time.Time // when LeaseLost suspended this primary
	releading    bool      // Relead asked, no answer yet
	peerTerm     uint64    // the highest term a peer reported while suspended

	// A standby that was itself stalled (its ticks stopped for more than
	// StallGap: SIGSTOP, a long GC or scheduling pause, a host hiccup)
	// must not judge its primary by a silence it caused: what the primary
	// sent meanwhile sits unread in its own socket buffers. It first
	// drains for DrainWindow (heartbeats and records are read and heard),
	// then judges.
	StallGap    time.Duration
	DrainWindow time.Duration
	lastTick    time.Time
	drainUntil  time.Time
}

// Defaults for stall handling: the runtime ticks every 5 ms and the
// primary sends a heartbeat every 20 ms, so a 50 ms gap between ticks is a
// stall, and 100 ms is enough to read what queued up.
const (
	DefaultStallGap    = 50 * time.Millisecond
	DefaultDrainWindow = 100 * time.Millisecond
)

// NewStandby returns a standby watching with det. A nil det makes a pure
// replica: it never takes over, by detection or by switchover.
func NewStandby(det Detector) *Node {
	return &Node{role: Standby, det: det, StallGap: DefaultStallGap, DrainWindow: DefaultDrainWindow}
}

// NewPrimary returns the first primary, term 1.
func NewPrimary() *Node { return &Node{role: Primary, term: 1} }

// NewCoordinatedPrimary returns a first primary that won its group's
// election under term (see Coordinated and SuspendLimit).
func NewCoordinatedPrimary(term uint64, suspendLimit time.Duration) *Node {
	return &Node{role: Primary, term: term, Coordinated: true, SuspendLimit: suspendLimit}
}

// Role is what the node does now.
func (n *Node) Role() Role { return n.role }

// Term is the highest term the node knows: its own while it leads.
func (n *Node) Term() uint64 { return n.term }

// LeaderTerm is the newest leader's term its coordinator reported (0:
// none; see LeaderElected).
func (n *Node) LeaderTerm() uint64 { return n.leaderTerm }

// Step feeds one observation and returns what the owner must do.
func (n *Node) Step(e Event) []Action {
	switch e.Kind {
	case Heard:
		return n.heard(e.At, e.Term)
	case Synced:
		n.InSync = e.InSync
		if !e.InSync && n.campaigning {
			n.campaigning = false
			return []Action{{Kind: Resign}}
		}
	case Tick:
		if n.role == Suspended {
			return n.giveUp(e.At)
		}
		if n.judges(e.At) && n.det.Suspect(e.At) {
			return n.takeOver()
		}
	case PeerTerm:
		return n.sawTerm(e.Term)
	case HandOver:
		if n.role == Standby && n.det != nil {
			return n.handOver()
		}
	case ElectionWon:
		return n.won(e.Term)
	case CampaignEnded:
		n.campaigning = false
	case CampaignAbandoned:
		n.campaigning = false
		return []Action{{Kind: Resign, Why: "the campaign a switchover asked for did not win in time"}}
	case LeaderElected:
		return n.leaderElected(e.Term)
	case LeaseLost, LeaseRegained, LeaseExpired, Deposed, Covered, HandedOff:
		return n.lease(e)
	}
	return nil
}

// leaderElected: the group's leader holds term. A standby follows no
// stream below it (its own term is raised only by what it hears, so that
// it can still use an election it wins under this very term); any other
// node treats it as a peer's term (a primary below it is fenced).
func (n *Node) leaderElected(term uint64) []Action {
	if n.role != Standby {
		return n.sawTerm(term)
	}
	if term <= n.leaderTerm {
		return nil
	}
	n.leaderTerm = term
	return []Action{{Kind: Follow, Term: term}}
}

// won: the coordinator says this node leads under term. Only a standby
// with a complete replica may use it, and only under a term above every
// term it has seen; otherwise it resigns.
func (n *Node) won(term uint64) []Action {
	if n.role == Primary {
		return nil // it already leads (a coordinated first primary)
	}
	if n.role != Standby || !n.InSync || term <= n.term {
		n.campaigning = false
		return []Action{{Kind: Resign}}
	}
	n.campaigning = false
	n.role, n.term = Primary, term
	return []Action{{Kind: Promote, Term: term}}
}

// judges reports whether a standby may judge its primary at t: it holds a
// complete replica, has a detector, and is not draining after a stall of
// its own.
func (n *Node) judges(t time.Time) bool {
	if n.role != Standby || n.det == nil {
		return false
	}
	if !n.lastTick.IsZero() && t.Sub(n.lastTick) > n.StallGap {
		n.drainUntil = t.Add(n.DrainWindow)
	}
	n.lastTick = t
	return n.InSync && !t.Before(n.drainUntil)
}

// heard records a heartbeat or record from a node at term.
func (n *Node) heard(t time.Time, term uint64) []Action {
	acts := n.sawTerm(term)
	if n.role == Standby && n.det != nil {
		n.det.Heartbeat(t)
	}
	if n.role == Standby {
		n.term = max(n.term, term) // a takeover must raise the primary's term
	}
	return acts
}

// sawTerm applies the fencing rule: a node that sees a higher term than its
// own while acting as primary stops serving.
//
// A suspended primary only remembers the term: a standby that learned of
// this node's own next term from etcd (a Relead's win) reports it before
// the coordinator has told this node, and whether another node leads is
// settled by etcd (LeaseRegained or Deposed).
func (n *Node) sawTerm(term uint64) []Action {
	if n.role == Suspended {
		n.peerTerm = max(n.peerTerm, term)
		return nil
	}
	if term <= n.term || n.role == Standby {
		return nil
	}
	n.term = term
	if n.role == Primary {
		n.role = Fenced
		return []Action{{Kind: Fence, Term: term, Why: fmt.Sprintf("a node under term %d took over", term)}}
	}
	return nil
}

// handOver: the primary asks this standby to take over. Coordinated, a
// standby with a complete replica campaigns (again, if a campaign already
// waits) and promotes only on ElectionWon: the primary resigns once this
// node's key waits behind its own.
func (n *Node) handOver() []Action {
	if n.Coordinated {
		if !n.InSync {
			return nil
		}
		n.campaigning = true
		return []Action{{Kind: Campaign}}
	}
	return n.takeOver()
}

// takeOver makes a standby the primary under a new term, or, coordinated,
// asks to campaign (once per campaign).
func (n *Node) takeOver() []Action {
	if n.Coordinated {
		if n.campaigning {
			return nil
		}
		n.campaigning = true
		return []Action{{Kind: Campaign}}
	}
	n.role = Primary
	n.term++
	return []Action{{Kind: Promote, Term: n.term}}
}
