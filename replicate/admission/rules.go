package admission

// View is what a standby knows when a primary asks to stream
// (the package doc says why each rule is there).
type View struct {
	Fenced bool
	// MinTerm: the coordinator's leader of record holds this term (0:
	// no coordinator, or none seen).
	MinTerm uint64
	// Pinned: the group an operator configured (--group; "": any).
	Pinned string
	// Adopt: an operator armed an adoption (--adopt): the next primary
	// is followed whatever its group or id.
	Adopt bool
	// Follows: the primary followed (nil: none yet, the replica is
	// empty).
	Follows *Identity
	// LogID and Applied: the log the replica holds records of, and how
	// far it applied them.
	LogID, Applied uint64
}

// Outcome is a rule's outcome: a refusal's reason, or one of the
// ways a primary is admitted.
type Outcome struct {
	Refuse RefuseReason // 0: admitted
	// How says why an admitted primary is: logged when it is not the
	// one followed already.
	How string
	// Adopts: the admission uses up an armed adoption.
	Adopts bool
}

// rules decide, first match wins, whether a primary presenting
// p may stream to a standby that knows v. The last rule admits.
var rules = []struct {
	when    func(v *View, p *Identity) bool
	outcome Outcome
}{
	{promoted, Outcome{Refuse: RefusedFenced}},
	{belowLeaderOfRecord, Outcome{Refuse: RefusedStaleTerm}},
	{leaderOfRecord, Outcome{How: "the coordinator's leader of record"}},
	{belowFollowedTerm, Outcome{Refuse: RefusedStaleTerm}},
	{adoptionArmed, Outcome{How: "adopted (--adopt)", Adopts: true}},
	{outsidePinnedGroup, Outcome{Refuse: RefusedOtherGroup}},
	{followsNone, Outcome{How: "the first primary (the replica was empty)"}},
	{otherGroup, Outcome{Refuse: RefusedOtherGroup}},
	{otherPrimaryAtTerm, Outcome{Refuse: RefusedOtherPrimary}},
	{behindReplica, Outcome{Refuse: RefusedRewound}},
	{higherTerm, Outcome{How: "a successor under a higher term"}},
	{always, Outcome{}},
}

// Admit returns the first matching rule's outcome.
func (v *View) Admit(p *Identity) Outcome {
	for _, rule := range rules {
		if rule.when(v, p) {
			return rule.outcome
		}
	}
	return Outcome{} // unreachable: the last rule always matches
}

// promoted: this node took over; no primary streams to it again.
func promoted(v *View, _ *Identity) bool { return v.Fenced }

// belowLeaderOfRecord: the coordinator's election gave a higher term to
// another leader; not even an adoption lets a deposed primary in.
func belowLeaderOfRecord(v *View, p *Identity) bool { return p.Term < v.MinTerm }

// leaderOfRecord: the coordinator names this term's leader, whoever the
// standby followed (a coordinator record adopts).
func leaderOfRecord(v *View, p *Identity) bool { return v.MinTerm > 0 && p.Term == v.MinTerm }

// belowFollowedTerm: the pair moved on to a higher term; this primary of
// the same group was deposed. An adoption does not undo a term.
func belowFollowedTerm(v *View, p *Identity) bool {
	return v.Follows != nil && p.Group == v.Follows.Group && p.Term < v.Follows.Term
}

func adoptionArmed(v *View, _ *Identity) bool { return v.Adopt }

func outsidePinnedGroup(v *View, p *Identity) bool {
	return v.Pinned != "" && p.Group != v.Pinned
}

// followsNone: a standby that never followed a primary has nothing to
// lose.
func followsNone(v *View, _ *Identity) bool { return v.Follows == nil }

func otherGroup(v *View, p *Identity) bool { return p.Group != v.Follows.Group }

func otherPrimaryAtTerm(v *View, p *Identity) bool {
	return p.Term == v.Follows.Term && p.Primary != v.Follows.Primary
}

// behindReplica: the primary's log is the replica's, but it ends before
// what the replica applied: the primary went back in time.
func behindReplica(v *View, p *Identity) bool {
	return v.LogID != 0 && p.Primary == v.LogID && p.Last < v.Applied
}

func higherTerm(v *View, p *Identity) bool { return p.Term > v.Follows.Term }

func always(*View, *Identity) bool { return true }
