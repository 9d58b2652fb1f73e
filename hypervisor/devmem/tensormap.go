package devmem

import (
	"math/bits"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// tensorElementBytes is the size of an element of each tensor-map data
// type (CUtensorMapDataType, UINT8 to TFLOAT32_FTZ); the packed sub-byte
// types after them are not served.
var tensorElementBytes = [...]uint64{1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4}

// TensorMapEncode has the GPU driver encode a tiled tensor map over
// memory the session holds: the tensor's every byte, as its dimensions and
// strides place them, must lie in one of the session's allocations.
func (m *Memory) TensorMapEncode(r *abi.TensorMapEncode) (abi.Body, error) {
	span, err := tensorSpan(r)
	if err != nil {
		return nil, err
	}
	if err := m.CheckRange(r.Global, span, "tensor map"); err != nil {
		return nil, err
	}
	enc, ok := m.ctx.(gpu.TensorMapEncoder)
	if !ok {
		return nil, fail(abi.StatusNotSupported, "this node's GPU encodes no tensor maps (the software GPU has no tensor-memory accelerator)")
	}
	onDevice := *r
	onDevice.Global = m.dev(r.Global)
	mp, err := enc.EncodeTensorMapTiled(&onDevice)
	if err != nil {
		return nil, err
	}
	return &abi.TensorMapReply{Map: mp}, nil
}

// tensorSpan is how many bytes from its base a tensor map's tensor
// reaches: a dense first dimension, then each further dimension's last
// entry a stride per step away. Every product and sum is checked.
func tensorSpan(r *abi.TensorMapEncode) (uint64, error) {
	if r.Rank == 0 || r.Rank > abi.MaxTensorRank {
		return 0, fail(abi.StatusInvalidValue, "tensor map of rank %d (1 to %d)", r.Rank, abi.MaxTensorRank)
	}
	if r.DataType >= uint32(len(tensorElementBytes)) {
		return 0, fail(abi.StatusNotSupported, "tensor map data type %d is not served", r.DataType)
	}
	for i := range r.Rank {
		if r.Dims[i] == 0 {
			return 0, fail(abi.StatusInvalidValue, "tensor map dimension %d is empty", i)
		}
	}
	hi, span := bits.Mul64(r.Dims[0], tensorElementBytes[r.DataType])
	for i := uint32(1); i < r.Rank && hi == 0; i++ {
		var reach, carry uint64
		hi, reach = bits.Mul64(r.Dims[i]-1, r.Strides[i-1])
		span, carry = bits.Add64(span, reach, 0)
		hi += carry
	}
	if hi != 0 {
		return 0, fail(abi.StatusInvalidValue, "tensor map reaches past 2^64 bytes")
	}
	return span, nil
}
