package replicate

import (
	"bytes"
	"testing"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate/admission"
)

// FuzzDecodeRecord: arbitrary bytes never panic the record decoder, and an
// accepted record re-encodes to its input.
func FuzzDecodeRecord(f *testing.F) {
	f.Add(AppendRecord(nil, &Record{Seq: 1, Op: OpSessionOpen, Body: []byte("g")}))
	f.Add(AppendRecord(nil, &Record{Seq: 2, Op: Op(4), Body: make([]byte, 20)}))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeRecord(b)
		if err != nil {
			return
		}
		if !bytes.Equal(AppendRecord(nil, &r), b) {
			t.Fatal("accepted record does not re-encode to its input")
		}
	})
}

// FuzzDecodeIdentity: arbitrary bytes never panic the identity decoder (a
// primary's msgIdentity), an accepted identity re-encodes to its input,
// and its group passes CheckGroup.
func FuzzDecodeIdentity(f *testing.F) {
	f.Add(AppendIdentity(nil, admission.Identity{Group: "pair", Primary: 7, Term: 3, Last: 9}))
	f.Add(AppendIdentity(nil, admission.Identity{}))
	f.Fuzz(func(t *testing.T, b []byte) {
		id, err := DecodeIdentity(b)
		if err != nil {
			return
		}
		if admission.CheckGroup(id.Group) != nil {
			t.Fatalf("accepted group %q", id.Group)
		}
		if !bytes.Equal(AppendIdentity(nil, id), b) {
			t.Fatal("accepted identity does not re-encode to its input")
		}
	})
}

// FuzzDecodeRefusal: arbitrary bytes never panic the refusal decoder (a
// standby's msgRefused); an accepted refusal has a known reason and
// re-encodes to its input.
func FuzzDecodeRefusal(f *testing.F) {
	f.Add(AppendRefusal(nil, admission.RefusedOtherGroup, admission.Identity{Group: "pair", Primary: 7, Term: 3}))
	f.Add([]byte{byte(admission.NumRefuseReasons)})
	f.Fuzz(func(t *testing.T, b []byte) {
		reason, id, err := decodeRefusal(b)
		if err != nil {
			return
		}
		if reason == 0 || reason >= admission.NumRefuseReasons {
			t.Fatalf("accepted reason %d", reason)
		}
		if !bytes.Equal(AppendRefusal(nil, reason, id), b) {
			t.Fatal("accepted refusal does not re-encode to its input")
		}
	})
}

// FuzzDecodeTensorMap: arbitrary bytes never panic an OpTensorMap body's
// decoder, and an accepted body re-encodes to its input.
func FuzzDecodeTensorMap(f *testing.F) {
	f.Add(AppendTensorMap(nil, &abi.TensorMapEncode{DataType: 7, Rank: 1, Global: 0x7f8a00001000, Dims: [abi.MaxTensorRank]uint64{16}},
		[abi.TensorMapBytes]byte{1, 2, 3}))
	f.Add(make([]byte, abi.TensorMapBytes))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, mp, err := DecodeTensorMap(b)
		if err != nil {
			return
		}
		if !bytes.Equal(AppendTensorMap(nil, r, mp), b) {
			t.Fatal("accepted tensor_map body does not re-encode to its input")
		}
	})
}
