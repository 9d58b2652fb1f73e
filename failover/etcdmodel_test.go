package failover

import (
	"fmt"
	"time"
)

// etcdModel is the coordinated worlds' etcd: one lease per node, the
// group's election (the lowest live key leads; a key lives while its
// lease does) and the group's term record, which a winner writes before
// it serves. A node renews every step while it reaches etcd. A stalled
// etcd (every member frozen) answers nobody and expires nothing until it
// runs again; then it expires every lease whose time passed meanwhile.
// Either node, once primary, runs the same lease logic (holder).
type etcdModel struct {
	w       *world
	stalled bool // every member frozen
	pCut    bool // P cannot reach etcd
	rev     uint64
	termKey uint64 // the group's term record
	p, s    holder

	campaigning bool // S asked to campaign
}

// holder is one node's lease and leader key as etcd and the node see them.
type holder struct {
	name       string
	n          *Node
	renewed    int    // the node's clock: its last successful renewal
	expiry     int    // etcd expires the lease then
	key        uint64 // its key in the election (0: none)
	resigning  bool   // fenced: it deletes its key once it reaches etcd
	releadFrom uint64 // it leads again only if the term record still names this (0: not asked)
}

func newEtcdModel(w *world) *etcdModel {
	e := &etcdModel{w: w, rev: 7, termKey: 7}
	e.p = holder{name: "P", n: w.p, key: 7, expiry: leaseTTL}
	e.s = holder{name: "S", n: w.s, expiry: leaseTTL}
	return e
}

func (e *etcdModel) say(format string, args ...any) {
	e.w.events = append(e.w.events, fmt.Sprintf(format, args...))
}

// step expires and renews leases and runs each primary's side of the
// coordinator.
func (e *etcdModel) step(ms int, at time.Time, pAlive bool) {
	sAlive := !e.w.sFrozen
	if !e.stalled {
		e.expire(ms)
		if sAlive && e.s.n.Role() == Standby {
			e.s.expiry = ms + leaseTTL
		}
	}
	if pAlive {
		covered := !e.w.cut && e.w.s.InSync && e.w.s.Role() == Standby
		e.primary(&e.p, ms, at, !e.stalled && !e.pCut, covered)
	}
	if sAlive && e.s.n.Role() != Standby {
		e.primary(&e.s, ms, at, !e.stalled, false) // S took over: no standby covers it
	}
}

func (e *etcdModel) expire(ms int) {
	if e.p.key != 0 && ms >= e.p.expiry {
		e.p.key = 0
	}
	if e.s.key != 0 && ms >= e.s.expiry {
		e.s.key = 0
		if e.s.n.Role() == Standby && e.campaigning {
			e.campaigning = false
			e.s.n.Step(Event{Kind: CampaignEnded})
			e.say("%d ms: S's lease expired with its campaign", ms)
		}
	}
}

// primary runs a node's lease while it is (or was) primary.
func (e *etcdModel) primary(h *holder, ms int, at time.Time, reach, covered bool) {
	n := h.n
	if n.Role() == Primary && reach && h.key != 0 {
		h.renewed, h.expiry = ms, ms+leaseTTL
	}
	if n.Role() == Primary && ms-h.renewed >= leaseTTL/2 {
		e.do(h, ms, n.Step(Event{Kind: LeaseLost, At: at}))
	}
	if n.Role() == Suspended && reach {
		e.suspended(h, ms, at)
	}
	if n.Role() == Fenced && h.resigning && reach {
		h.key, h.resigning, h.releadFrom = 0, false, 0
	}
	n.Step(Event{Kind: Covered, InSync: covered})
	e.do(h, ms, n.Step(Event{Kind: Tick, At: at}))
}

// suspended: a suspended primary that reaches etcd renews its lease and
// proves it leads, or learns the lease expired and asks to lead again.
func (e *etcdModel) suspended(h *holder, ms int, at time.Time) {
	switch {
	case h.releadFrom != 0:
		h.renewed, h.expiry = ms, ms+leaseTTL
	case h.key != 0:
		h.renewed, h.expiry = ms, ms+leaseTTL
		if e.termKey == h.key {
			e.do(h, ms, h.n.Step(Event{Kind: LeaseRegained, Term: h.key, At: at}))
		} else {
			e.do(h, ms, h.n.Step(Event{Kind: Deposed, Term: e.termKey, At: at}))
		}
	default:
		e.do(h, ms, h.n.Step(Event{Kind: LeaseExpired, At: at}))
	}
}

// do carries out a primary's actions.
func (e *etcdModel) do(h *holder, ms int, acts []Action) {
	for _, a := range acts {
		switch a.Kind {
		case Suspend:
			e.say("%d ms: %s's lease unrenewed for %d ms: suspended", ms, h.name, ms-h.renewed)
		case Resume:
			e.say("%d ms: %s proves it leads: serves again under term %d", ms, h.name, a.Term)
		case Relead:
			if e.termKey != a.Term {
				e.say("%d ms: %s's lease expired; the term record names %d", ms, h.name, e.termKey)
				e.do(h, ms, h.n.Step(Event{Kind: Deposed, Term: e.termKey}))
				continue
			}
			e.rev += 5
			h.key, h.releadFrom, h.renewed, h.expiry = e.rev, a.Term, ms, ms+leaseTTL
			e.say("%d ms: %s's lease expired: it campaigns again", ms, h.name)
		case Fence:
			h.resigning = true
			e.say("%d ms: %s fenced: %s", ms, h.name, a.Why)
		}
	}
}

// elect runs the election once S had its tick: S's campaign puts its key;
// the lowest live key leads and its holder writes the term record.
func (e *etcdModel) elect(ms int) {
	if e.stalled {
		return
	}
	if e.campaigning && e.s.key == 0 && !e.w.sFrozen {
		e.rev += 5
		e.s.key = e.rev
	}
	if e.campaigning && e.leads(&e.s, &e.p) {
		e.campaigning = false
		if promotes(e.w.s.Step(Event{Kind: ElectionWon, Term: e.s.key})) {
			e.termKey = e.s.key
			e.s.renewed = ms
			e.say("%d ms: S wins the election, term %d", ms, e.w.s.Term())
		} else {
			e.s.key = 0
		}
	}
	if !e.w.crashed && !e.w.frozen && !e.pCut {
		e.releadWin(&e.p, &e.s, ms)
	}
	if !e.w.sFrozen {
		e.releadWin(&e.s, &e.p, ms)
	}
}

// leads reports whether h's key is the lowest live one.
func (e *etcdModel) leads(h, other *holder) bool {
	return h.key != 0 && (other.key == 0 || h.key < other.key)
}

// releadWin: a suspended node's new key leads: it writes the term record
// over its old term, or learns that another node's term is there.
func (e *etcdModel) releadWin(h, other *holder, ms int) {
	if h.releadFrom == 0 || h.n.Role() != Suspended {
		return
	}
	if e.termKey != h.releadFrom {
		e.do(h, ms, h.n.Step(Event{Kind: Deposed, Term: e.termKey}))
		return
	}
	if !e.leads(h, other) {
		return // its key waits
	}
	e.termKey, h.releadFrom = h.key, 0
	e.do(h, ms, h.n.Step(Event{Kind: LeaseRegained, Term: h.key}))
}
