package failover

import (
	"fmt"
	"testing"
	"time"
)

// TestEtcdStallSequences drives the coordinated world (etcdModel, a lease
// of 1000 ms, P's suspend limit one lease) through every sequence of two
// and three whole-etcd stalls of 300, 700, 1400 and 3000 ms, 200 ms or
// 1500 ms apart, and checks at every 10 ms step that the two nodes never
// serve at once, that from one lease after etcd recovered exactly one
// node serves, and that stalls P can ride out (shorter than half the
// lease plus its suspend limit) never move the primary.
func TestEtcdStallSequences(t *testing.T) {
	lens := []int{300, 700, 1400, 3000}
	for _, gap := range []int{200, 1500} {
		for _, seq := range stallSequences(lens) {
			t.Run(fmt.Sprintf("gap%d/%v", gap, seq), func(t *testing.T) { checkStalls(t, seq, gap) })
		}
	}
}

// stallSequences are all sequences of two and three lengths from lens.
func stallSequences(lens []int) [][]int {
	var out [][]int
	for _, a := range lens {
		for _, b := range lens {
			out = append(out, []int{a, b})
			for _, c := range lens {
				out = append(out, []int{a, b, c})
			}
		}
	}
	return out
}

// rideOut is the longest stall P rides out: half a lease until it
// suspends, then its suspend limit.
const rideOut = leaseTTL/2 + leaseTTL

func checkStalls(t *testing.T, seq []int, gap int) {
	w := newWorld(true)
	w.run(0, 1000)
	ms := 1010
	serving := func() (p, s bool) {
		return !w.crashed && !w.frozen && w.p.Role() == Primary, w.s.Role() == Primary
	}
	advance := func(d int, check func(ms int)) {
		for end := ms + d; ms < end; ms += 10 {
			w.step(ms)
			p, s := serving()
			if p && s {
				t.Fatalf("%d ms: both nodes serve (P term %d, S term %d); events:\n%v", ms, w.p.Term(), w.s.Term(), w.events)
			}
			if check != nil {
				check(ms)
			}
		}
	}
	short := true
	for i, d := range seq {
		short = short && d < rideOut
		w.etcd.stalled = true
		advance(d, nil)
		w.etcd.stalled = false
		if i < len(seq)-1 {
			advance(gap, nil)
		}
	}
	recovered := ms
	advance(3*leaseTTL, func(ms int) {
		if p, s := serving(); ms >= recovered+leaseTTL && p == s {
			t.Fatalf("%d ms, %d ms after etcd recovered: P %s term %d, S %s term %d: want exactly one serving; events:\n%v",
				ms, ms-recovered, w.p.Role(), w.p.Term(), w.s.Role(), w.s.Term(), w.events)
		}
	})
	if short && w.s.Role() != Standby {
		t.Fatalf("stalls %v, each shorter than %d ms, moved the primary: S %s term %d; events:\n%v", seq, rideOut, w.s.Role(), w.s.Term(), w.events)
	}
}

// TestSuspendedPrimary: what a suspended primary does with each input.
func TestSuspendedPrimary(t *testing.T) {
	suspended := func() *Node {
		n := NewCoordinatedPrimary(7, 1000*time.Millisecond)
		if acts := n.Step(Event{Kind: LeaseLost, At: at(0)}); len(acts) != 1 || acts[0].Kind != Suspend || n.Role() != Suspended {
			t.Fatalf("lease lost: %v, role %s; want Suspend", acts, n.Role())
		}
		return n
	}
	kinds := func(acts []Action) []ActionKind {
		var ks []ActionKind
		for _, a := range acts {
			ks = append(ks, a.Kind)
		}
		return ks
	}
	for _, tc := range []struct {
		name   string
		events []Event
		want   Role
		term   uint64
		last   []ActionKind
	}{
		{"lease kept", []Event{{Kind: LeaseRegained, Term: 7}}, Primary, 7, []ActionKind{Resume}},
		{"led again", []Event{{Kind: LeaseExpired}, {Kind: LeaseRegained, Term: 12}}, Primary, 12, []ActionKind{Resume}},
		{"its own next term reported first", []Event{{Kind: LeaseExpired}, {Kind: PeerTerm, Term: 12}, {Kind: LeaseRegained, Term: 12}}, Primary, 12, []ActionKind{Resume}},
		{"a higher term reported", []Event{{Kind: PeerTerm, Term: 20}, {Kind: LeaseRegained, Term: 12}}, Fenced, 20, []ActionKind{Fence}},
		{"a higher term alone does not fence", []Event{{Kind: PeerTerm, Term: 20}}, Suspended, 7, nil},
		{"deposed", []Event{{Kind: LeaseExpired}, {Kind: Deposed, Term: 12}}, Fenced, 12, []ActionKind{Fence}},
		{"relead asked once", []Event{{Kind: LeaseExpired}, {Kind: LeaseExpired}}, Suspended, 7, nil},
		{"covered: gives up at the limit", []Event{{Kind: Covered, InSync: true}, {Kind: Tick, At: at(999)}, {Kind: Tick, At: at(1000)}}, Fenced, 7, []ActionKind{Fence}},
		{"uncovered: never gives up", []Event{{Kind: Covered, InSync: false}, {Kind: Tick, At: at(100000)}}, Suspended, 7, nil},
		{"heard, no fence", []Event{{Kind: Heard, Term: 30, At: at(5)}}, Suspended, 7, nil},
	} {
		n := suspended()
		var last []Action
		for _, e := range tc.events {
			last = n.Step(e)
		}
		if n.Role() != tc.want || n.Term() != tc.term || fmt.Sprint(kinds(last)) != fmt.Sprint(tc.last) {
			t.Errorf("%s: %s term %d, last actions %v; want %s term %d, %v", tc.name, n.Role(), n.Term(), kinds(last), tc.want, tc.term, tc.last)
		}
	}
	s := NewStandby(mustNew("fixed"))
	s.Coordinated = true
	if acts := s.Step(Event{Kind: LeaseRegained, Term: 9}); len(acts) != 1 || acts[0].Kind != Resign {
		t.Fatalf("a standby told it leads: %v; want a resignation", acts)
	}
}
