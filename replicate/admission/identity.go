package admission

import (
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"
)

// Identity is who a primary says it is when it connects, and, in a
// refusal, whom the standby follows.
type Identity struct {
	// Group names the pair: the operator's --group, or the first
	// primary's id (hex) that every successor carries on.
	Group string `json:"group"`
	// Primary is the primary's id: its log's id, new with every primary
	// process and every promotion.
	Primary uint64 `json:"primary"`
	Term    uint64 `json:"term"`
	// Last is the newest sequence the primary's log holds (0 in a
	// refusal).
	Last uint64 `json:"-"`
}

// maxGroupBytes bounds a group's name on the wire and in flags.
const maxGroupBytes = 128

// CheckGroup reports whether name may name a group: at most
// maxGroupBytes of UTF-8 with no space or control character (it is logged
// and shown in status as it is).
func CheckGroup(name string) error {
	if len(name) > maxGroupBytes {
		return fmt.Errorf("group name of %d bytes (at most %d)", len(name), maxGroupBytes)
	}
	if !utf8.ValidString(name) {
		return errors.New("group name is not UTF-8")
	}
	for _, r := range name {
		if unicode.IsSpace(r) || unicode.IsControl(r) {
			return fmt.Errorf("group name %q holds a space or control character", name)
		}
	}
	return nil
}

// RefuseReason says why a standby refused a primary's stream (the
// reason label of the refusal counters).
type RefuseReason uint8

// Reasons. The zero reason is invalid (and means admitted where a
// reason is returned).
const (
	_ RefuseReason = iota
	// RefusedAuth: the peer failed the handshake (wrong key, not a
	// vgpuha peer, another protocol version) or sent no identity.
	RefusedAuth
	// RefusedFenced: this standby was promoted; the primary is told the
	// newer term.
	RefusedFenced
	// RefusedStaleTerm: the primary's term is below the one the standby
	// follows (or its coordinator's leader holds); it is told that term.
	RefusedStaleTerm
	// RefusedOtherGroup: the primary belongs to another group.
	RefusedOtherGroup
	// RefusedOtherPrimary: another primary already holds the primary's
	// term in this group.
	RefusedOtherPrimary
	// RefusedRewound: the primary the standby follows came back behind
	// what the replica applied from its log.
	RefusedRewound
	NumRefuseReasons // one past the last reason
)

var refuseReasonNames = [NumRefuseReasons]string{RefusedAuth: "auth", RefusedFenced: "fenced", RefusedStaleTerm: "stale_term",
	RefusedOtherGroup: "other_group", RefusedOtherPrimary: "other_primary", RefusedRewound: "rewound"}

func (r RefuseReason) String() string {
	if r == 0 || r >= NumRefuseReasons {
		return fmt.Sprintf("reason(%d)", uint8(r))
	}
	return refuseReasonNames[r]
}

// RefuseReasons are every reason, in order (for metrics made ahead).
func RefuseReasons() []RefuseReason {
	out := make([]RefuseReason, 0, NumRefuseReasons-1)
	for r := RefusedAuth; r < NumRefuseReasons; r++ {
		out = append(out, r)
	}
	return out
}

// refusalAdvice is what the primary's log says an operator can do.
var refusalAdvice = [NumRefuseReasons]string{
	RefusedStaleTerm:    "this primary was deposed: a newer primary holds the standby",
	RefusedOtherGroup:   "the standby protects another pair: check --replicate-to and --group, or restart the standby (or start it with --adopt) to replace its replica",
	RefusedOtherPrimary: "another primary holds this term: two primaries run with one configuration; stop the stray one",
	RefusedRewound:      "this primary's log is behind the standby's replica (restored from an image?): the standby holds newer state",
}

// RefusedError is a standby's refusal of this primary's stream.
type RefusedError struct {
	Reason RefuseReason
	// Follows is whom the standby follows (its term: the newer term for
	// RefusedStaleTerm).
	Follows Identity
	// Self is the identity this primary presented.
	Self Identity
}

// ErrRefused matches every RefusedError (errors.Is).
var ErrRefused = errors.New("replicate: the standby refused this primary")

func (e *RefusedError) Error() string {
	return fmt.Sprintf("the standby refused this primary (%s): it follows group %q, primary %016x, term %d; this primary is group %q, primary %016x, term %d: %s",
		e.Reason, e.Follows.Group, e.Follows.Primary, e.Follows.Term, e.Self.Group, e.Self.Primary, e.Self.Term, refusalAdvice[min(e.Reason, NumRefuseReasons-1)])
}

// Is makes errors.Is(err, ErrRefused) true.
func (e *RefusedError) Is(target error) bool { return target == ErrRefused }
