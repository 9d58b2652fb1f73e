package abi

// Virtual memory management (CUDA's cuMemAddressReserve, cuMemMap and
// their inverses): a guest reserves a range of its window, unbacked, and
// maps device memory at exact addresses inside it. The node executes both,
// so the standby replays them and the ranges and mappings sit at the same
// addresses there. Physical allocation handles (cuMemCreate) never cross
// the link: the guest keeps them, and a mapping carries only its range.

// AddressReserve reserves Size bytes of the session's window aligned to
// Align (zero: the node's allocation alignment), preferably at Hint (a
// hint the node may ignore, as CUDA may); replied as an AllocReply.
type AddressReserve struct{ Size, Align, Hint uint64 }

// AddressFree frees the reservation [Ptr, Ptr+Size) (it must have no
// mapping left).
type AddressFree struct{ Ptr, Size uint64 }

// MemMap backs exactly [Ptr, Ptr+Size), inside one reservation and over no
// mapping, with device memory.
type MemMap struct{ Ptr, Size uint64 }

// MemUnmap unmaps [Ptr, Ptr+Size), which must be whole mappings that
// follow one another, and frees their device memory.
type MemUnmap struct{ Ptr, Size uint64 }

func (m *AddressReserve) Append(b []byte) []byte {
	return appendU64(appendU64(appendU64(b, m.Size), m.Align), m.Hint)
}
func (m *AddressFree) Append(b []byte) []byte { return appendU64(appendU64(b, m.Ptr), m.Size) }
func (m *MemMap) Append(b []byte) []byte      { return appendU64(appendU64(b, m.Ptr), m.Size) }
func (m *MemUnmap) Append(b []byte) []byte    { return appendU64(appendU64(b, m.Ptr), m.Size) }

func (m *AddressReserve) decode(d *Decoder) { m.Size, m.Align, m.Hint = d.U64(), d.U64(), d.U64() }
func (m *AddressFree) decode(d *Decoder)    { m.Ptr, m.Size = d.U64(), d.U64() }
func (m *MemMap) decode(d *Decoder)         { m.Ptr, m.Size = d.U64(), d.U64() }
func (m *MemUnmap) decode(d *Decoder)       { m.Ptr, m.Size = d.U64(), d.U64() }
