package failover

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
)

// TestRoles runs the golden scenarios in testdata/roles: a primary P and a
// standby S, a network that can be cut, nodes that can crash or freeze, and
// time that advances in steps. Every step delivers P's heartbeats to S when
// both are running and the link is up, ticks S's detector, and delivers the
// newest term to P when the link is up (the fenced reply a promoted standby
// gives a reconnecting primary). Output: each node's role and term.
//
//	run from=MS to=MS        advance time, one 10 ms step at a time
//	crash|freeze|thaw node=P|S   (a frozen S reads P's heartbeats when it thaws)
//	cut / heal               the P-S link
//	switchover               P hands over to S
//
// testdata/coordinated runs the same commands with a coordinator (start
// coordinated): P holds a lease of 1000 ms that it renews every step while
// it reaches etcd, and stops serving once it went unrenewed for half the
// TTL; S campaigns instead of taking over and wins once the lease expired.
//
//	isolate      cut P from S and from etcd (guests still reach it)
//	cut-etcd     cut P from etcd only
//
// A run during which both nodes served says for how long.
func TestRoles(t *testing.T) {
	datadriven.RunTest(t, "testdata/roles", func(t *testing.T, td *datadriven.TestData) string {
		return rolesCmd(t, td)
	})
}

func TestCoordinatedRoles(t *testing.T) {
	datadriven.RunTest(t, "testdata/coordinated", func(t *testing.T, td *datadriven.TestData) string {
		return rolesCmd(t, td)
	})
}

// leaseTTL is the modelled coordinator lease.
const leaseTTL = 1000

type world struct {
	p, s            *Node
	crashed, frozen bool
	sFrozen         bool
	backlog         int // P's heartbeats queued in a frozen S's socket
	cut             bool
	events          []string
	bothMS          int // time both nodes served during one run
	last            int // the last step's time (ms)

	etcd *etcdModel // coordinated worlds
}

var w *world

func rolesCmd(t *testing.T, td *datadriven.TestData) string {
	switch td.Cmd {
	case "start":
		w = newWorld(td.HasArg("coordinated"))
	case "unsynced":
		w.s.Step(Event{Kind: Synced, InSync: false})
	case "crash":
		w.crashed = true
	case "freeze":
		if nodeArg(t, td) == "S" {
			w.sFrozen = true
		} else {
			w.frozen = true
		}
	case "thaw":
		if nodeArg(t, td) == "S" {
			w.sFrozen = false
		} else {
			w.frozen = false
		}
	case "cut":
		w.cut = true
	case "isolate":
		w.cut, w.etcd.pCut = true, true
	case "cut-etcd":
		w.etcd.pCut = true
	case "stall-etcd":
		w.etcd.stalled = true
	case "unstall-etcd":
		w.etcd.stalled = false
	case "heal":
		w.cut = false
		if w.etcd != nil {
			w.etcd.pCut = false
		}
	case "switchover":
		w.switchover()
	case "run":
		var from, to int
		td.ScanArgs(t, "from", &from)
		td.ScanArgs(t, "to", &to)
		w.run(from, to)
	default:
		return "unknown command " + td.Cmd
	}
	out := strings.Join(w.events, "\n")
	w.events = nil
	if out != "" {
		out += "\n"
	}
	return out + fmt.Sprintf("P: %s term %d; S: %s term %d", w.p.Role(), w.p.Term(), w.s.Role(), w.s.Term())
}

func newWorld(coordinated bool) *world {
	w := &world{p: NewPrimary(), s: NewStandby(mustNew("fixed"))}
	if coordinated {
		w.p = NewCoordinatedPrimary(7, leaseTTL*time.Millisecond) // 7: the first primary's leader key revision
		w.s.Coordinated = true
		w.etcd = newEtcdModel(w)
	}
	w.s.Step(Event{Kind: Synced, InSync: true})
	return w
}

// run advances time from from to to, one 10 ms step at a time.
func (w *world) run(from, to int) {
	for ms := from; ms <= to; ms += 10 {
		w.step(ms)
	}
	if w.bothMS > 0 {
		w.events = append(w.events, fmt.Sprintf("both nodes served for %d ms", w.bothMS))
		w.bothMS = 0
	}
}

func (w *world) switchover() {
	acts := w.s.Step(Event{Kind: HandOver})
	if len(acts) == 1 && acts[0].Kind == Campaign {
		// P resigns once S's key waits behind its own: S's leads next.
		w.etcd.rev += 5
		verdict := "S resigns the win"
		if promotes(w.s.Step(Event{Kind: ElectionWon, Term: w.etcd.rev})) {
			verdict = fmt.Sprintf("S promotes under term %d", w.s.Term())
			e := w.etcd
			e.termKey, e.s.key, e.p.key = w.s.Term(), w.s.Term(), 0
			e.s.renewed, e.s.expiry = w.last, w.last+leaseTTL
		}
		w.events = append(w.events, "S campaigns, P resigns, S wins: "+verdict)
	}
	w.p.Step(Event{Kind: PeerTerm, Term: w.s.Term()})
}

// sendsHeartbeats: P is up and its links run (a suspended primary keeps
// them).
func (w *world) sendsHeartbeats() bool {
	return !w.crashed && !w.frozen && (w.p.Role() == Primary || w.p.Role() == Suspended)
}

// step advances the world to ms.
func (w *world) step(ms int) {
	at := t0.Add(time.Duration(ms) * time.Millisecond)
	pAlive := !w.crashed && !w.frozen
	w.last = ms
	if w.etcd != nil {
		w.etcd.step(ms, at, pAlive)
	}
	if w.sFrozen {
		if w.sendsHeartbeats() && !w.cut {
			w.backlog++
		}
		return
	}
	if w.backlog > 0 { // S wakes: its tick comes before it reads its socket
		w.tickS(ms, at)
		for ; w.backlog > 0; w.backlog-- {
			w.s.Step(Event{Kind: Heard, At: at, Term: w.p.Term()})
		}
	}
	if w.sendsHeartbeats() && !w.cut {
		w.s.Step(Event{Kind: Heard, At: at, Term: w.p.Term()})
	}
	w.tickS(ms, at)
	if w.etcd != nil {
		w.etcd.elect(ms)
	}
	if w.sendsHeartbeats() && !w.cut && w.s.Role() == Primary {
		before := w.p.Role()
		w.p.Step(Event{Kind: PeerTerm, Term: w.s.Term()})
		if before == Primary {
			w.events = append(w.events, fmt.Sprintf("%d ms: P learns term %d: %s", ms, w.s.Term(), w.p.Role()))
		}
	}
	if pAlive && w.p.Role() == Primary && w.s.Role() == Primary {
		w.bothMS += 10
	}
}

// tickS ticks S's detector and carries out what it asks.
func (w *world) tickS(ms int, at time.Time) {
	for _, a := range w.s.Step(Event{Kind: Tick, At: at}) {
		switch a.Kind {
		case Promote:
			w.events = append(w.events, fmt.Sprintf("%d ms: S takes over, term %d", ms, w.s.Term()))
		case Campaign:
			w.etcd.campaigning = true
			w.events = append(w.events, fmt.Sprintf("%d ms: S campaigns", ms))
		}
	}
}

func nodeArg(t *testing.T, td *datadriven.TestData) string {
	node := "P"
	if td.HasArg("node") {
		td.ScanArgs(t, "node", &node)
	}
	return node
}

func promotes(acts []Action) bool {
	return len(acts) == 1 && acts[0].Kind == Promote
}

// TestCoordinatedResigns: a coordinated standby resigns a win it must not
// use (a token not above a term it knows, or no complete replica), and
// withdraws a waiting campaign when a resync begins.
func TestCoordinatedResigns(t *testing.T) {
	n := NewStandby(mustNew("fixed"))
	n.Coordinated = true
	n.Step(Event{Kind: Synced, InSync: true})
	n.Step(Event{Kind: Heard, At: at(0), Term: 9})
	if acts := n.Step(Event{Kind: ElectionWon, Term: 9}); len(acts) != 1 || acts[0].Kind != Resign || n.Role() != Standby {
		t.Fatalf("won under a known term: %v, role %s; want a resignation", acts, n.Role())
	}
	if acts := n.Step(Event{Kind: Tick, At: at(1000)}); len(acts) != 1 || acts[0].Kind != Campaign {
		t.Fatalf("silent primary: %v, want a campaign", acts)
	}
	if acts := n.Step(Event{Kind: Tick, At: at(1005)}); len(acts) != 0 {
		t.Fatalf("campaigns twice: %v", acts)
	}
	if acts := n.Step(Event{Kind: Synced, InSync: false}); len(acts) != 1 || acts[0].Kind != Resign {
		t.Fatalf("resync while campaigning: %v, want a resignation", acts)
	}
	if acts := n.Step(Event{Kind: ElectionWon, Term: 20}); len(acts) != 1 || acts[0].Kind != Resign {
		t.Fatalf("won without a complete replica: %v, want a resignation", acts)
	}
	n.Step(Event{Kind: Synced, InSync: true})
	if acts := n.Step(Event{Kind: ElectionWon, Term: 20}); len(acts) != 1 || acts[0].Kind != Promote || n.Term() != 20 {
		t.Fatalf("a good win: %v, term %d; want Promote(20)", acts, n.Term())
	}
}

// TestCoordinatorReports: what the coordinator's other reports do. A
// standby follows the newest leader's term without taking it as its own
// (it can still use a win under that very term: the watch may report the
// standby's own election before the win arrives); a primary below a
// reported leader is fenced; a primary that handed its key to a standby
// is fenced; an abandoned campaign is withdrawn.
func TestCoordinatorReports(t *testing.T) {
	s := NewStandby(mustNew("fixed"))
	s.Coordinated = true
	s.Step(Event{Kind: Synced, InSync: true})
	s.Step(Event{Kind: Heard, At: at(0), Term: 7})
	if acts := s.Step(Event{Kind: LeaderElected, Term: 9}); len(acts) != 1 || acts[0].Kind != Follow || acts[0].Term != 9 || s.LeaderTerm() != 9 {
		t.Fatalf("leader 9 on a standby: %v; want Follow(9)", acts)
	}
	if acts := s.Step(Event{Kind: LeaderElected, Term: 8}); len(acts) != 0 {
		t.Fatalf("an older leader: %v; want nothing", acts)
	}
	s.Step(Event{Kind: Tick, At: at(1000)}) // campaigns
	if acts := s.Step(Event{Kind: ElectionWon, Term: 9}); !promotes(acts) || s.Term() != 9 {
		t.Fatalf("a win under the reported leader's term: %v, term %d; want Promote(9)", acts, s.Term())
	}

	p := NewCoordinatedPrimary(7, time.Second)
	if acts := p.Step(Event{Kind: LeaderElected, Term: 7}); len(acts) != 0 || p.Role() != Primary {
		t.Fatalf("its own election reported: %v, %s; want nothing", acts, p.Role())
	}
	if acts := p.Step(Event{Kind: LeaderElected, Term: 12}); len(acts) != 1 || acts[0].Kind != Fence || p.Term() != 12 {
		t.Fatalf("a newer leader: %v, term %d; want Fence(12)", acts, p.Term())
	}

	h := NewCoordinatedPrimary(7, time.Second)
	if acts := h.Step(Event{Kind: HandedOff}); len(acts) != 1 || acts[0].Kind != Fence || h.Role() != Fenced || h.Term() != 7 {
		t.Fatalf("handed off: %v, %s term %d; want Fence under 7", acts, h.Role(), h.Term())
	}
	if acts := h.Step(Event{Kind: PeerTerm, Term: 9}); len(acts) != 0 || h.Term() != 9 {
		t.Fatalf("the new primary's term: %v, term %d; want it recorded", acts, h.Term())
	}

	c := NewStandby(mustNew("fixed"))
	c.Coordinated = true
	c.Step(Event{Kind: Synced, InSync: true})
	if acts := c.Step(Event{Kind: HandOver}); len(acts) != 1 || acts[0].Kind != Campaign {
		t.Fatalf("hand over: %v; want Campaign", acts)
	}
	if acts := c.Step(Event{Kind: CampaignAbandoned}); len(acts) != 1 || acts[0].Kind != Resign {
		t.Fatalf("abandoned: %v; want Resign", acts)
	}
	if acts := c.Step(Event{Kind: Tick, At: at(5000)}); len(acts) != 0 {
		t.Fatalf("after the withdrawal, with no heartbeat yet: %v", acts)
	}
}
