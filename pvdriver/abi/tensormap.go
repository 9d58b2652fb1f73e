package abi

import "encoding/binary"

// Tensor maps (CUDA's cuTensorMapEncodeTiled): a 128-byte descriptor of a
// tile of a tensor in device memory that a Hopper kernel's tensor-memory
// accelerator reads. Its format is the GPU driver's own, so the guest asks
// the node to encode it; it names device addresses, which a standby shares,
// and changes no state, so it is neither logged nor replicated.

// MaxTensorRank bounds a tensor map's rank, as CUDA's does.
const MaxTensorRank = 5

// TensorMapBytes is the size of an encoded tensor map (CUtensorMap).
const TensorMapBytes = 128

// TensorMapEncode is cuTensorMapEncodeTiled's arguments: a tensor of Rank
// dimensions at Global, Dims elements each, Strides bytes between
// consecutive entries of dimensions 1 to Rank-1 (dimension 0 is dense),
// read in boxes of Box elements, every ElementStrides-th element. Entries
// past Rank are zero. The enums are CUDA's values.
type TensorMapEncode struct {
	DataType, Rank                            uint32
	Global                                    uint64
	Dims                                      [MaxTensorRank]uint64
	Strides                                   [MaxTensorRank - 1]uint64
	Box, ElementStrides                       [MaxTensorRank]uint32
	Interleave, Swizzle, L2Promotion, OOBFill uint32
}

// TensorMapReply is an encoded tensor map.
type TensorMapReply struct{ Map [TensorMapBytes]byte }

func (m *TensorMapEncode) Append(b []byte) []byte {
	b = binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(b, m.DataType), m.Rank)
	b = appendU64(b, m.Global)
	for _, v := range m.Dims {
		b = appendU64(b, v)
	}
	for _, v := range m.Strides {
		b = appendU64(b, v)
	}
	for _, v := range m.Box {
		b = binary.LittleEndian.AppendUint32(b, v)
	}
	for _, v := range m.ElementStrides {
		b = binary.LittleEndian.AppendUint32(b, v)
	}
	return binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(b, m.Interleave), m.Swizzle), m.L2Promotion), m.OOBFill)
}

func (m *TensorMapEncode) decode(d *Decoder) {
	m.DataType, m.Rank, m.Global = d.U32(), d.U32(), d.U64()
	for i := range m.Dims {
		m.Dims[i] = d.U64()
	}
	for i := range m.Strides {
		m.Strides[i] = d.U64()
	}
	for i := range m.Box {
		m.Box[i] = d.U32()
	}
	for i := range m.ElementStrides {
		m.ElementStrides[i] = d.U32()
	}
	m.Interleave, m.Swizzle, m.L2Promotion, m.OOBFill = d.U32(), d.U32(), d.U32(), d.U32()
}

func (m *TensorMapReply) Append(b []byte) []byte { return append(b, m.Map[:]...) }
func (m *TensorMapReply) decode(d *Decoder)      { copy(m.Map[:], d.take(TensorMapBytes)) }
