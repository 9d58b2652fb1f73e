package replicate

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"
)

// Identity and terms on the link (protocol 5).
//
// A primary introduces itself before anything else on an authenticated
// link (msgIdentity), and the standby decides whether it may stream
// before it lets go of the link it has, so a refused primary never
// touches the replica: no reset, no resync, no link dropped. A standby
// remembers the primary it follows (its group, its id and its term) and
// refuses, with a reason both ends log and count:
//
//   - another group's primary, even at a higher term: the pair's group is
//     a name an operator gave (--group) or, without one, the first
//     primary's id, which a standby that takes over passes on to its own
//     standbys;
//   - a primary below the term it follows (a deposed one): the primary is
//     told the term and fences itself;
//   - another primary at the term it follows (two primaries cannot hold
//     one term: a stray started with the same configuration);
//   - the primary it follows at a log position behind what the replica
//     applied from that log (a primary restored from an image: its guests
//     went back in time, the standby did not).
//
// A standby that follows no one yet (it started empty: nothing to lose)
// takes the first primary of its group (--group, when set), and one whose
// operator armed an adoption (--adopt) takes the next primary whatever
// its group or id, once. With a coordinator, the leader of record (the
// term the coordinator's election gave) is admitted whoever the standby
// followed, and a primary below it is refused. A promoted standby refuses
// every primary and tells it the newer term (msgFenced), as before.

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

// identityFixed is an encoded identity's size without its group's name.
const identityFixed = 8 + 8 + 8 + 2

// appendIdentity encodes id: term, primary, last, then the group's name
// with its length.
func appendIdentity(b []byte, id Identity) []byte {
	b = binary.LittleEndian.AppendUint64(b, id.Term)
	b = binary.LittleEndian.AppendUint64(b, id.Primary)
	b = binary.LittleEndian.AppendUint64(b, id.Last)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(id.Group)))
	return append(b, id.Group...)
}

// decodeIdentity decodes an identity from a peer; the whole of b must be
// one.
func decodeIdentity(b []byte) (Identity, error) {
	if len(b) < identityFixed {
		return Identity{}, fmt.Errorf("%w: a %d-byte identity", ErrCorrupt, len(b))
	}
	id := Identity{Term: binary.LittleEndian.Uint64(b), Primary: binary.LittleEndian.Uint64(b[8:]), Last: binary.LittleEndian.Uint64(b[16:])}
	n := int(binary.LittleEndian.Uint16(b[24:]))
	if len(b) != identityFixed+n {
		return Identity{}, fmt.Errorf("%w: identity's group of %d bytes in %d", ErrCorrupt, n, len(b)-identityFixed)
	}
	id.Group = string(b[identityFixed:])
	if err := CheckGroup(id.Group); err != nil {
		return Identity{}, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return id, nil
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
	refuseReasons // one past the last reason
)

var refuseReasonNames = [refuseReasons]string{RefusedAuth: "auth", RefusedFenced: "fenced", RefusedStaleTerm: "stale_term",
	RefusedOtherGroup: "other_group", RefusedOtherPrimary: "other_primary", RefusedRewound: "rewound"}

func (r RefuseReason) String() string {
	if r == 0 || r >= refuseReasons {
		return fmt.Sprintf("reason(%d)", uint8(r))
	}
	return refuseReasonNames[r]
}

// RefuseReasons are every reason, in order (for metrics made ahead).
func RefuseReasons() []RefuseReason {
	out := make([]RefuseReason, 0, refuseReasons-1)
	for r := RefusedAuth; r < refuseReasons; r++ {
		out = append(out, r)
	}
	return out
}

// refusalAdvice is what the primary's log says an operator can do.
var refusalAdvice = [refuseReasons]string{
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
		e.Reason, e.Follows.Group, e.Follows.Primary, e.Follows.Term, e.Self.Group, e.Self.Primary, e.Self.Term, refusalAdvice[min(e.Reason, refuseReasons-1)])
}

// Is makes errors.Is(err, ErrRefused) true.
func (e *RefusedError) Is(target error) bool { return target == ErrRefused }

// appendRefusal encodes a refusal: the reason, then whom the standby
// follows.
func appendRefusal(b []byte, reason RefuseReason, follows Identity) []byte {
	return appendIdentity(append(b, byte(reason)), follows)
}

// decodeRefusal decodes a standby's refusal.
func decodeRefusal(b []byte) (RefuseReason, Identity, error) {
	if len(b) < 1 {
		return 0, Identity{}, fmt.Errorf("%w: an empty refusal", ErrCorrupt)
	}
	reason := RefuseReason(b[0])
	if reason == 0 || reason >= refuseReasons {
		return 0, Identity{}, fmt.Errorf("%w: refusal reason %d", ErrCorrupt, b[0])
	}
	id, err := decodeIdentity(b[1:])
	return reason, id, err
}
