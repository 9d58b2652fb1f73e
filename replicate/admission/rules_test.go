package admission

import "testing"

// TestAdmissionRules: every stale-node story against the rule table.
func TestAdmissionRules(t *testing.T) {
	pair := &Identity{Group: "pair", Primary: 0xa1, Term: 3}
	followsAt := func(term uint64) *Identity { return &Identity{Group: "pair", Primary: 0xa1, Term: term} }
	for _, tc := range []struct {
		story string
		view  View
		p     Identity
		want  RefuseReason
	}{
		{"a standby started empty adopts the first primary", View{},
			Identity{Group: "anything", Primary: 9, Term: 1}, 0},
		{"an empty standby given --group refuses another group", View{Pinned: "pair"},
			Identity{Group: "other", Primary: 9, Term: 1}, RefusedOtherGroup},
		{"an empty standby given --group takes its group", View{Pinned: "pair"},
			Identity{Group: "pair", Primary: 9, Term: 1}, 0},
		{"the same primary reconnects", View{Follows: pair, LogID: 0xa1, Applied: 50},
			Identity{Group: "pair", Primary: 0xa1, Term: 3, Last: 50}, 0},
		{"a successor under a higher term (failover, switchover)", View{Follows: pair},
			Identity{Group: "pair", Primary: 0xb2, Term: 4}, 0},
		{"the old primary's command line again, group named: deposed", View{Follows: pair},
			Identity{Group: "pair", Primary: 0xc3, Term: 1}, RefusedStaleTerm},
		{"the old primary's command line again, group unnamed (its own id)", View{Follows: pair},
			Identity{Group: "00000000000000c3", Primary: 0xc3, Term: 1}, RefusedOtherGroup},
		{"a stray started with the pair's configuration, same term", View{Follows: followsAt(1)},
			Identity{Group: "pair", Primary: 0xc3, Term: 1}, RefusedOtherPrimary},
		{"two pairs share one standby by mistake", View{Follows: pair},
			Identity{Group: "other-pair", Primary: 0xd4, Term: 1}, RefusedOtherGroup},
		{"another pair's primary at a higher term", View{Follows: pair},
			Identity{Group: "other-pair", Primary: 0xd4, Term: 9}, RefusedOtherGroup},
		{"a primary restored from an image (its process and log with it)", View{Follows: pair, LogID: 0xa1, Applied: 1000},
			Identity{Group: "pair", Primary: 0xa1, Term: 3, Last: 100}, RefusedRewound},
		{"a primary restored from an image of an earlier term", View{Follows: pair, LogID: 0xa1, Applied: 1000},
			Identity{Group: "pair", Primary: 0x99, Term: 2, Last: 5000}, RefusedStaleTerm},
		{"a primary restored from an image whose process restarted", View{Follows: followsAt(1)},
			Identity{Group: "pair", Primary: 0xe5, Term: 1}, RefusedOtherPrimary},
		{"--adopt takes another group", View{Follows: pair, Adopt: true},
			Identity{Group: "other-pair", Primary: 0xd4, Term: 1}, 0},
		{"--adopt overrides --group", View{Pinned: "pair", Adopt: true},
			Identity{Group: "other-pair", Primary: 0xd4, Term: 1}, 0},
		{"--adopt does not undo a term", View{Follows: pair, Adopt: true},
			Identity{Group: "pair", Primary: 0xc3, Term: 2}, RefusedStaleTerm},
		{"coordinated: below the leader of record", View{MinTerm: 40, Adopt: true},
			Identity{Group: "pair", Primary: 0xc3, Term: 39}, RefusedStaleTerm},
		{"coordinated: the leader of record adopts", View{MinTerm: 40, Follows: &Identity{Group: "old", Primary: 1, Term: 12}},
			Identity{Group: "pair", Primary: 0xc3, Term: 40}, 0},
		{"a promoted standby refuses everyone", View{Fenced: true},
			Identity{Group: "pair", Primary: 0xa1, Term: 99}, RefusedFenced},
	} {
		if got := tc.view.Admit(&tc.p); got.Refuse != tc.want {
			t.Errorf("%s: %v, want %v", tc.story, got.Refuse, tc.want)
		}
	}
}

// TestRefuseReasonNames: every reason has a name (the metrics' label and
// the status fields).
func TestRefuseReasonNames(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range RefuseReasons() {
		name := r.String()
		if name == "" || seen[name] || name[0] == 'r' && name != "rewound" {
			t.Errorf("reason %d named %q", r, name)
		}
		seen[name] = true
	}
	if len(seen) != int(NumRefuseReasons)-1 {
		t.Errorf("%d names for %d reasons", len(seen), NumRefuseReasons-1)
	}
}
