package node

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/failover"
)

// TestAuthoritySequences drives the authority through the event sequences
// the drills produce and checks, in order, each view it pushes (to the
// server, the log and the receiver) and each action it carries out: the
// view always comes first, so that nothing a promotion or a fence does
// runs under the old role.
func TestAuthoritySequences(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	ev := func(k failover.EventKind, ms int, term uint64) failover.Event {
		return failover.Event{Kind: k, At: at(ms), Term: term}
	}
	// ticks are the runtime's ticks every 5 ms from ms to until, as
	// authority.run makes them.
	ticks := func(ms, until int) []failover.Event {
		var out []failover.Event
		for ; ms <= until; ms += 5 {
			out = append(out, ev(failover.Tick, ms, 0))
		}
		return out
	}
	seq := func(parts ...any) []failover.Event {
		var out []failover.Event
		for _, p := range parts {
			switch p := p.(type) {
			case failover.Event:
				out = append(out, p)
			case []failover.Event:
				out = append(out, p...)
			}
		}
		return out
	}
	synced := failover.Event{Kind: failover.Synced, InSync: true}
	standby := func() *failover.Node { return failover.NewStandby(&failover.Fixed{Timeout: failover.DefaultTimeout}) }
	coordStandby := func() *failover.Node { n := standby(); n.Coordinated = true; return n }
	coordPrimary := func() *failover.Node { return failover.NewCoordinatedPrimary(7, time.Second) }
	covered := failover.Event{Kind: failover.Covered, InSync: true}

	cases := []struct {
		name   string
		node   func() *failover.Node
		events []failover.Event
		want   string
	}{
		{"kill: the standby takes over", standby,
			seq(synced, ev(failover.Heard, 0, 1), ticks(5, 400)),
			"push standby term 1 | push primary term 2 | do Promote(2)"},
		{"freeze or blackout of 200 ms: nothing", standby,
			seq(synced, ev(failover.Heard, 0, 1), ticks(5, 220), ev(failover.Heard, 225, 1), ticks(225, 450)),
			"push standby term 1"},
		{"the standby's own 2 s freeze: it drains before judging", standby,
			seq(synced, ev(failover.Heard, 0, 1), ticks(5, 5), ev(failover.Tick, 2005, 0), ev(failover.Heard, 2010, 1), ticks(2010, 2200)),
			"push standby term 1"},
		{"blackout of 600 ms: the old primary learns the new term", failover.NewPrimary,
			[]failover.Event{ev(failover.PeerTerm, 0, 2)},
			"push fenced term 2 (a node under term 2 took over) | do Fence(2)"},
		{"switchover, two nodes: the standby", standby,
			seq(synced, ev(failover.Heard, 0, 1), failover.Event{Kind: failover.HandOver}),
			"push standby term 1 | push primary term 2 | do Promote(2)"},
		{"switchover, coordinated: the standby", coordStandby,
			[]failover.Event{synced, ev(failover.Heard, 0, 7), {Kind: failover.HandOver}, ev(failover.LeaderElected, 10, 9), ev(failover.ElectionWon, 11, 9)},
			"push standby term 7 | do Campaign(0) | push standby term 7 leader 9 | do Follow(9) | push primary term 9 leader 9 | do Promote(9)"},
		{"switchover, coordinated: the primary", coordPrimary,
			[]failover.Event{ev(failover.HandedOff, 0, 0), ev(failover.PeerTerm, 5, 9)},
			"push fenced term 7 (it handed its leadership to a standby (switchover)) | do Fence(7) | push fenced term 9 (it handed its leadership to a standby (switchover))"},
		{"switchover, coordinated: the election does not come", coordStandby,
			[]failover.Event{synced, {Kind: failover.HandOver}, {Kind: failover.CampaignAbandoned}},
			"do Campaign(0) | do Resign(0)"},
		{"kill, coordinated: campaign, win, promote", coordStandby,
			seq(synced, ev(failover.Heard, 0, 7), ticks(5, 400), ev(failover.ElectionWon, 405, 12)),
			"push standby term 7 | do Campaign(0) | push primary term 12 | do Promote(12)"},
		{"etcd frozen shorter than the lease", coordPrimary,
			[]failover.Event{ev(failover.LeaseLost, 0, 0), ev(failover.LeaseRegained, 800, 7)},
			"push suspended term 7 (its coordinator lease went unrenewed for half its TTL) | do Suspend(7) | push primary term 7 | do Resume(7)"},
		{"etcd stalled past the lease: lead again, nobody led", coordPrimary,
			[]failover.Event{ev(failover.LeaseLost, 0, 0), ev(failover.LeaseExpired, 1500, 0), ev(failover.LeaseRegained, 1600, 15)},
			"push suspended term 7 (its coordinator lease went unrenewed for half its TTL) | do Suspend(7) | do Relead(7) | push primary term 15 | do Resume(15)"},
		{"etcd stalled past the lease: another node leads", coordPrimary,
			[]failover.Event{ev(failover.LeaseLost, 0, 0), ev(failover.Deposed, 1500, 20)},
			"push suspended term 7 (its coordinator lease went unrenewed for half its TTL) | do Suspend(7) | push fenced term 20 (the group's term record names term 20: another node leads) | do Fence(20)"},
		{"cut from etcd alone, covered: gives up for the standby", coordPrimary,
			seq(covered, ev(failover.LeaseLost, 0, 0), ticks(5, 1200)),
			"push suspended term 7 (its coordinator lease went unrenewed for half its TTL) | do Suspend(7) | push fenced term 7 (suspended for 1s without reaching etcd; a standby in sync takes over) | do Fence(7)"},
		{"a newer leader reported to a primary", coordPrimary,
			[]failover.Event{ev(failover.LeaderElected, 0, 7), ev(failover.LeaderElected, 5, 30)},
			"push fenced term 30 (a node under term 30 took over) | do Fence(30)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			a := &authority{}
			a.init(tc.node(), func() time.Time { return t0 },
				func(act failover.Action) { got = append(got, fmt.Sprintf("do %s(%d)", kindName(act.Kind), act.Term)) },
				func(v view) { got = append(got, v.String()) })
			got = got[:0] // the first view, pushed at init
			for _, e := range tc.events {
				a.step(e)
				a.drain()
			}
			if s := strings.Join(got, " | "); s != tc.want {
				t.Errorf("got  %s\nwant %s", s, tc.want)
			}
		})
	}
}

func kindName(k failover.ActionKind) string {
	return [...]string{"?", "Promote", "Fence", "Campaign", "Resign", "Suspend", "Resume", "Relead", "Follow"}[k]
}

func (v view) String() string {
	s := fmt.Sprintf("push %s term %d", v.role, v.term)
	if v.leaderTerm != 0 {
		s += fmt.Sprintf(" leader %d", v.leaderTerm)
	}
	if v.why != "" {
		s += " (" + v.why + ")"
	}
	return s
}
