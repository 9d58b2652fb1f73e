package failover

import (
	"fmt"
	"time"
)

// lease handles a coordinated primary's lease: it suspends when its
// lease may be lost, resumes once its coordinator proved it still leads
// (or leads again with nobody in between), asks to lead again once etcd
// expired the lease, and fences once another node leads. A node that is
// not a (suspended) primary only gives back a leadership it must not use.
//
//	Primary   --LeaseLost-->       Suspended   (Suspend)
//	Suspended --LeaseRegained(t)--> Primary    (Resume t)
//	Suspended --LeaseExpired-->    Suspended   (Relead: lead again if no one led after Term)
//	Suspended --Deposed(t)-->      Fenced      (Fence)
//	Primary   --HandedOff-->       Fenced      (Fence: a switchover gave the leader key away)
//	Suspended --Tick past SuspendLimit, covered--> Fenced (Fence: the standby takes over)
func (n *Node) lease(e Event) []Action {
	switch e.Kind {
	case Covered:
		n.covered = e.InSync
	case LeaseLost:
		if n.role == Primary {
			n.role, n.suspendedAt, n.peerTerm, n.releading = Suspended, e.At, 0, false
			return []Action{{Kind: Suspend, Term: n.term, Why: "its coordinator lease went unrenewed for half its TTL"}}
		}
	case LeaseRegained:
		return n.regained(e.Term)
	case LeaseExpired:
		if n.role == Suspended && !n.releading {
			n.releading = true
			return []Action{{Kind: Relead, Term: n.term, Why: "etcd expired its lease; leading again if no node led since"}}
		}
	case HandedOff:
		if n.role == Primary || n.role == Suspended {
			n.role = Fenced
			return []Action{{Kind: Fence, Term: n.term, Why: "it handed its leadership to a standby (switchover)"}}
		}
	case Deposed:
		if n.role == Primary || n.role == Suspended {
			n.role, n.term = Fenced, max(n.term, e.Term)
			return []Action{{Kind: Fence, Term: n.term, Why: fmt.Sprintf("the group's term record names term %d: another node leads", e.Term)}}
		}
	}
	return nil
}

// regained: the coordinator proved this node leads under term.
func (n *Node) regained(term uint64) []Action {
	switch {
	case n.role == Primary:
		return nil
	case n.role != Suspended:
		return []Action{{Kind: Resign, Why: "a leadership regained after this node stopped leading"}}
	case term < n.term || term < n.peerTerm:
		n.role, n.term = Fenced, max(n.term, n.peerTerm)
		return []Action{{Kind: Fence, Term: n.term, Why: fmt.Sprintf("regained term %d, but a node reported term %d", term, n.peerTerm)}}
	}
	n.role, n.term, n.releading = Primary, term, false
	return []Action{{Kind: Resume, Term: term, Why: "its coordinator proved it still leads"}}
}

// giveUp fences a suspended primary that a standby in sync covers once it
// was suspended for SuspendLimit: that standby takes over once it hears
// nothing more (the fence stops the links).
func (n *Node) giveUp(at time.Time) []Action {
	if n.SuspendLimit <= 0 || !n.covered || at.Sub(n.suspendedAt) < n.SuspendLimit {
		return nil
	}
	n.role = Fenced
	return []Action{{Kind: Fence, Term: n.term, Why: fmt.Sprintf("suspended for %v without reaching etcd; a standby in sync takes over", n.SuspendLimit)}}
}
