package hypervisor

import (
	"errors"
	"testing"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// TestTensorMapRefusedHere: the software GPU encodes no tensor maps, so a
// map over the session's memory is refused as not supported; one reaching
// past its allocation, or of rank 0, is refused before any backend sees
// it. (hypervisor/cuda's GPU encodes them; TestHandlersAgreeWithABI skips
// the op for that reason.)
func TestTensorMapRefusedHere(t *testing.T) {
	sess := newSimSession(t)
	reply, err := sess.handle(abi.OpAlloc, 1, false, (&abi.Alloc{Size: 4096}).Append(nil))
	if err != nil {
		t.Fatal(err)
	}
	ptr := abi.ResultOf(reply)
	tile := func(rows uint64) *abi.TensorMapEncode {
		return &abi.TensorMapEncode{DataType: 7, Rank: 2, Global: ptr, Dims: [abi.MaxTensorRank]uint64{32, rows},
			Strides: [abi.MaxTensorRank - 1]uint64{128}, Box: [abi.MaxTensorRank]uint32{32, 8}, ElementStrides: [abi.MaxTensorRank]uint32{1, 1}}
	}
	for i, tt := range []struct {
		req  *abi.TensorMapEncode
		want abi.Status
	}{
		{tile(32), abi.StatusNotSupported}, // 32 rows of 128 bytes: the allocation exactly
		{tile(33), abi.StatusOutOfRange},   // one row past it
		{&abi.TensorMapEncode{DataType: 7, Global: ptr}, abi.StatusInvalidValue},
	} {
		_, err := sess.handle(abi.OpTensorMapEncode, uint64(i+2), false, tt.req.Append(nil))
		if st := statusOf(err); !errors.Is(err, tt.want) && st != tt.want {
			t.Errorf("%+v: %v (status %v), want %v", tt.req, err, st, tt.want)
		}
	}
}
