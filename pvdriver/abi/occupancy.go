package abi

import (
	"encoding/binary"
	"fmt"
)

// Occupancy questions (CUDA's cuOccupancy* calls): how many blocks of a
// function fit on one multiprocessor, how many clusters of a launch shape
// can be resident at once, the largest cluster a launch shape allows.
// The answers are the node's GPU driver's, which knows the function's
// registers and shared memory and the GPU's partitioning; a library's own
// estimate differs, and libraries (cuDNN) choose kernels by them, so a
// program through the library would compute with other kernels than
// natively. Nothing changes on the device: neither logged nor replicated.

// OccupancyKind says which question an Occupancy asks.
type OccupancyKind uint8

const (
	// OccupancyBlocks: active blocks per multiprocessor
	// (cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags).
	OccupancyBlocks OccupancyKind = iota + 1
	// OccupancyClusters: clusters resident at once
	// (cuOccupancyMaxActiveClusters).
	OccupancyClusters
	// OccupancyClusterSize: the largest cluster size
	// (cuOccupancyMaxPotentialClusterSize).
	OccupancyClusterSize
	occupancyKindLimit
)

// Occupancy asks one occupancy question about a function (a guest
// handle) with Block threads per block and SharedBytes of dynamic shared
// memory; clusters questions also have the launch's Grid and Cluster
// shape (zero: the function's own). MaxDynamicShared and NonPortable are
// the function's attributes as the guest set them
// (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
// NON_PORTABLE_CLUSTER_SIZE_ALLOWED), which the answer depends on.
type Occupancy struct {
	Function         uint64
	Kind             OccupancyKind
	Flags            uint32
	Block            Dim3
	Grid             Dim3
	Cluster          Dim3
	SharedBytes      uint32
	MaxDynamicShared uint32
	NonPortable      bool
}

// OccupancyReply is the answer.
type OccupancyReply struct{ Value int32 }

func (m *Occupancy) Append(b []byte) []byte {
	b = append(appendU64(b, m.Function), byte(m.Kind))
	b = binary.LittleEndian.AppendUint32(b, m.Flags)
	for _, d := range []Dim3{m.Block, m.Grid, m.Cluster} {
		b = binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(b, d.X), d.Y), d.Z)
	}
	b = binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(b, m.SharedBytes), m.MaxDynamicShared)
	if m.NonPortable {
		return append(b, 1)
	}
	return append(b, 0)
}

func (m *Occupancy) decode(d *Decoder) {
	m.Function, m.Kind, m.Flags = d.U64(), OccupancyKind(d.U8()), d.U32()
	for _, p := range []*Dim3{&m.Block, &m.Grid, &m.Cluster} {
		p.X, p.Y, p.Z = d.U32(), d.U32(), d.U32()
	}
	m.SharedBytes, m.MaxDynamicShared = d.U32(), d.U32()
	switch v := d.U8(); {
	case d.err != nil:
	case m.Kind == 0 || m.Kind >= occupancyKindLimit:
		d.fail(fmt.Errorf("%w: occupancy question %d", ErrBadArgument, m.Kind))
	case v > 1:
		d.fail(fmt.Errorf("%w: non-portable flag %d", ErrBadArgument, v))
	default:
		m.NonPortable = v == 1
	}
}

func (m *OccupancyReply) Append(b []byte) []byte {
	return binary.LittleEndian.AppendUint32(b, uint32(m.Value))
}
func (m *OccupancyReply) decode(d *Decoder) { m.Value = int32(d.U32()) }
