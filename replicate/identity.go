package replicate

import (
	"encoding/binary"
	"fmt"

	"github.com/vgpuha/vgpuha/replicate/admission"
	"github.com/vgpuha/vgpuha/replicate/link"
)

// A primary's identity (msgIdentity) and a standby's refusal (msgRefused)
// on the link; package admission says what they mean.

// IdentityFixed is an encoded identity's size without its group's name.
const IdentityFixed = 8 + 8 + 8 + 2

// AppendIdentity encodes id (a primary's msgIdentity): term, primary,
// last, then the group's name with its length.
func AppendIdentity(b []byte, id admission.Identity) []byte {
	b = binary.LittleEndian.AppendUint64(b, id.Term)
	b = binary.LittleEndian.AppendUint64(b, id.Primary)
	b = binary.LittleEndian.AppendUint64(b, id.Last)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(id.Group)))
	return append(b, id.Group...)
}

// DecodeIdentity decodes an identity from a peer (a primary's msgIdentity,
// read by the standby's receiver); the whole of b must be one.
func DecodeIdentity(b []byte) (admission.Identity, error) {
	if len(b) < IdentityFixed {
		return admission.Identity{}, fmt.Errorf("%w: a %d-byte identity", link.ErrCorrupt, len(b))
	}
	id := admission.Identity{Term: binary.LittleEndian.Uint64(b), Primary: binary.LittleEndian.Uint64(b[8:]), Last: binary.LittleEndian.Uint64(b[16:])}
	n := int(binary.LittleEndian.Uint16(b[24:]))
	if len(b) != IdentityFixed+n {
		return admission.Identity{}, fmt.Errorf("%w: identity's group of %d bytes in %d", link.ErrCorrupt, n, len(b)-IdentityFixed)
	}
	id.Group = string(b[IdentityFixed:])
	if err := admission.CheckGroup(id.Group); err != nil {
		return admission.Identity{}, fmt.Errorf("%w: %v", link.ErrCorrupt, err)
	}
	return id, nil
}

// AppendRefusal encodes a refusal (sent by the standby's receiver): the reason, then whom the standby
// follows.
func AppendRefusal(b []byte, reason admission.RefuseReason, follows admission.Identity) []byte {
	return AppendIdentity(append(b, byte(reason)), follows)
}

// decodeRefusal decodes a standby's refusal.
func decodeRefusal(b []byte) (admission.RefuseReason, admission.Identity, error) {
	if len(b) < 1 {
		return 0, admission.Identity{}, fmt.Errorf("%w: an empty refusal", link.ErrCorrupt)
	}
	reason := admission.RefuseReason(b[0])
	if reason == 0 || reason >= admission.NumRefuseReasons {
		return 0, admission.Identity{}, fmt.Errorf("%w: refusal reason %d", link.ErrCorrupt, b[0])
	}
	id, err := DecodeIdentity(b[1:])
	return reason, id, err
}
