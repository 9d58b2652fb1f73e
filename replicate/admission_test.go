package replicate

import (
	"errors"
	"testing"

	"github.com/vgpuha/vgpuha/replicate/admission"
	"github.com/vgpuha/vgpuha/replicate/link"
)

// TestIdentityRoundTrip: identities and refusals decode as encoded; a
// truncated or padded one, or a bad group, does not decode.
func TestIdentityRoundTrip(t *testing.T) {
	id := admission.Identity{Group: "gpu-pair-7", Primary: 0xdeadbeef, Term: 3, Last: 77}
	b := AppendIdentity(nil, id)
	if got, err := DecodeIdentity(b); err != nil || got != id {
		t.Fatalf("identity: %+v, %v", got, err)
	}
	for _, bad := range [][]byte{b[:len(b)-1], append(b, 0), b[:IdentityFixed-1], AppendIdentity(nil, admission.Identity{Group: "two words"})} {
		if _, err := DecodeIdentity(bad); !errors.Is(err, link.ErrCorrupt) {
			t.Errorf("%x decoded: %v", bad, err)
		}
	}
	reason, follows, err := decodeRefusal(AppendRefusal(nil, admission.RefusedOtherGroup, id))
	if err != nil || reason != admission.RefusedOtherGroup || follows != id {
		t.Fatalf("refusal: %v %+v %v", reason, follows, err)
	}
	if _, _, err := decodeRefusal(AppendRefusal(nil, 0, id)); err == nil {
		t.Error("refusal without a reason decoded")
	}
}
