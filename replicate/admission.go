package replicate

// admissionView is what a standby knows when a primary asks to stream
// (identity.go says why each rule is there).
type admissionView struct {
	fenced bool
	// minTerm: the coordinator's leader of record holds this term (0:
	// no coordinator, or none seen).
	minTerm uint64
	// pinned: the group an operator configured (--group; "": any).
	pinned string
	// adopt: an operator armed an adoption (--adopt): the next primary
	// is followed whatever its group or id.
	adopt bool
	// follows: the primary followed (nil: none yet, the replica is
	// empty).
	follows *Identity
	// logID and applied: the log the replica holds records of, and how
	// far it applied them.
	logID, applied uint64
}

// admission is a rule's outcome: a refusal's reason, or one of the
// ways a primary is admitted.
type admission struct {
	refuse RefuseReason // 0: admitted
	// how says why an admitted primary is: logged when it is not the
	// one followed already.
	how string
	// adopts: the admission uses up an armed adoption.
	adopts bool
}

// admissionRules decide, first match wins, whether a primary presenting
// p may stream to a standby that knows v. The last rule admits.
var admissionRules = []struct {
	when    func(v *admissionView, p *Identity) bool
	outcome admission
}{
	{promoted, admission{refuse: RefusedFenced}},
	{belowLeaderOfRecord, admission{refuse: RefusedStaleTerm}},
	{leaderOfRecord, admission{how: "the coordinator's leader of record"}},
	{belowFollowedTerm, admission{refuse: RefusedStaleTerm}},
	{adoptionArmed, admission{how: "adopted (--adopt)", adopts: true}},
	{outsidePinnedGroup, admission{refuse: RefusedOtherGroup}},
	{followsNone, admission{how: "the first primary (the replica was empty)"}},
	{otherGroup, admission{refuse: RefusedOtherGroup}},
	{otherPrimaryAtTerm, admission{refuse: RefusedOtherPrimary}},
	{behindReplica, admission{refuse: RefusedRewound}},
	{higherTerm, admission{how: "a successor under a higher term"}},
	{always, admission{}},
}

// admit returns the first matching rule's outcome.
func (v *admissionView) admit(p *Identity) admission {
	for _, rule := range admissionRules {
		if rule.when(v, p) {
			return rule.outcome
		}
	}
	return admission{} // unreachable: the last rule always matches
}

// promoted: this node took over; no primary streams to it again.
func promoted(v *admissionView, _ *Identity) bool { return v.fenced }

// belowLeaderOfRecord: the coordinator's election gave a higher term to
// another leader; not even an adoption lets a deposed primary in.
func belowLeaderOfRecord(v *admissionView, p *Identity) bool { return p.Term < v.minTerm }

// leaderOfRecord: the coordinator names this term's leader, whoever the
// standby followed (a coordinator record adopts).
func leaderOfRecord(v *admissionView, p *Identity) bool { return v.minTerm > 0 && p.Term == v.minTerm }

// belowFollowedTerm: the pair moved on to a higher term; this primary of
// the same group was deposed. An adoption does not undo a term.
func belowFollowedTerm(v *admissionView, p *Identity) bool {
	return v.follows != nil && p.Group == v.follows.Group && p.Term < v.follows.Term
}

func adoptionArmed(v *admissionView, _ *Identity) bool { return v.adopt }

func outsidePinnedGroup(v *admissionView, p *Identity) bool {
	return v.pinned != "" && p.Group != v.pinned
}

// followsNone: a standby that never followed a primary has nothing to
// lose.
func followsNone(v *admissionView, _ *Identity) bool { return v.follows == nil }

func otherGroup(v *admissionView, p *Identity) bool { return p.Group != v.follows.Group }

func otherPrimaryAtTerm(v *admissionView, p *Identity) bool {
	return p.Term == v.follows.Term && p.Primary != v.follows.Primary
}

// behindReplica: the primary's log is the replica's, but it ends before
// what the replica applied: the primary went back in time.
func behindReplica(v *admissionView, p *Identity) bool {
	return v.logID != 0 && p.Primary == v.logID && p.Last < v.applied
}

func higherTerm(v *admissionView, p *Identity) bool { return p.Term > v.follows.Term }

func always(*admissionView, *Identity) bool { return true }
