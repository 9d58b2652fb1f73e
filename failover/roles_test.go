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
func TestRoles(t *testing.T) {
	datadriven.RunTest(t, "testdata/roles", func(t *testing.T, td *datadriven.TestData) string {
		return rolesCmd(t, td)
	})
}

type world struct {
	p, s            *Node
	crashed, frozen bool
	sFrozen         bool
	backlog         int // P's heartbeats queued in a frozen S's socket
	cut             bool
	events          []string
}

var w *world

func rolesCmd(t *testing.T, td *datadriven.TestData) string {
	switch td.Cmd {
	case "start":
		w = &world{p: NewPrimary(), s: NewStandby(mustNew("fixed"))}
		w.s.Step(Event{Kind: Synced, InSync: true})
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
	case "heal":
		w.cut = false
	case "switchover":
		w.s.Step(Event{Kind: HandOver})
		w.p.Step(Event{Kind: PeerTerm, Term: w.s.Term})
	case "run":
		var from, to int
		td.ScanArgs(t, "from", &from)
		td.ScanArgs(t, "to", &to)
		for ms := from; ms <= to; ms += 10 {
			at := t0.Add(time.Duration(ms) * time.Millisecond)
			pAlive := !w.crashed && !w.frozen
			if w.sFrozen {
				if pAlive && !w.cut && w.p.Role == Primary {
					w.backlog++
				}
				continue
			}
			if w.backlog > 0 { // S wakes: its tick comes before it reads its socket
				if promotes(w.s.Step(Event{Kind: Tick, At: at})) {
					w.events = append(w.events, fmt.Sprintf("%d ms: S takes over, term %d", ms, w.s.Term))
				}
				for ; w.backlog > 0; w.backlog-- {
					w.s.Step(Event{Kind: Heard, At: at, Term: w.p.Term})
				}
			}
			if pAlive && !w.cut && w.p.Role == Primary {
				w.s.Step(Event{Kind: Heard, At: at, Term: w.p.Term})
			}
			if promotes(w.s.Step(Event{Kind: Tick, At: at})) {
				w.events = append(w.events, fmt.Sprintf("%d ms: S takes over, term %d", ms, w.s.Term))
			}
			if pAlive && !w.cut && w.s.Role == Primary && w.p.Role == Primary {
				w.p.Step(Event{Kind: PeerTerm, Term: w.s.Term})
				w.events = append(w.events, fmt.Sprintf("%d ms: P learns term %d: %s", ms, w.s.Term, w.p.Role))
			}
		}
	default:
		return "unknown command " + td.Cmd
	}
	out := strings.Join(w.events, "\n")
	w.events = nil
	if out != "" {
		out += "\n"
	}
	return out + fmt.Sprintf("P: %s term %d; S: %s term %d", w.p.Role, w.p.Term, w.s.Role, w.s.Term)
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
