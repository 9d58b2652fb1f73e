package devmem

import (
	"math/bits"

	"github.com/vgpuha/vgpuha/handlemap"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Virtual memory management (CUDA's cuMemAddressReserve, cuMemMap and
// their inverses) as the node serves it: a reservation is a range of the
// window that nothing else is placed in and that holds no memory; a
// mapping is device memory backing exactly its range inside one
// reservation, allocated like any allocation (the backend's Alloc at an
// exact address) and counted against the same quotas. A mapping is an
// allocation in every other respect: copies, verify, repair and resync
// snapshots see it among Ranges. Copies and kernel arguments may span
// mappings that follow one another (a program sees one contiguous range),
// never a gap or a plain allocation. Reservations and mappings are
// requests the node executes, so the standby replays them and holds them
// at the same addresses.
//
// Physical allocation handles (cuMemCreate) are the guest library's: the
// node never sees one, only the ranges mapped.

// maxReserveAlign bounds a reservation's alignment (CUDA does not say; a
// window is far smaller).
const maxReserveAlign = 1 << 40

// Reservations lists the reserved ranges, by address.
func (m *Memory) Reservations() []handlemap.Range { return m.reserved.All() }

// Mapped reports whether a mapping (not a plain allocation) starts at ptr.
func (m *Memory) Mapped(ptr uint64) bool { return m.mapped[ptr] }

// AddressReserve reserves a range of the window (at the placed address on
// a resync; at the hint when it is free and aligned; else the first that
// fits). It allocates nothing.
func (m *Memory) AddressReserve(r *abi.AddressReserve) (abi.Body, error) {
	align := max(r.Align, m.cfg.AllocAlign)
	switch {
	case r.Size == 0 || r.Size%m.cfg.AllocAlign != 0:
		return nil, fail(abi.StatusInvalidValue, "address reserve of %d bytes: not a non-zero multiple of the %d-byte granularity", r.Size, m.cfg.AllocAlign)
	case align&(align-1) != 0 || align > maxReserveAlign:
		return nil, fail(abi.StatusInvalidValue, "address reserve aligned to %d bytes: not a power of two up to %d", r.Align, uint64(maxReserveAlign))
	}
	if err := m.objs.CheckRoom(); err != nil {
		return nil, err
	}
	addr, ok := m.placeReservation(r.Size, align, r.Hint)
	if !ok {
		return nil, fail(abi.StatusOutOfMemory, "no room to reserve %d bytes in the session's %d-byte address window (--va.window-bytes)", r.Size, m.size)
	}
	if err := m.reserved.Insert(addr, r.Size); err != nil {
		m.space.Remove(addr)
		return nil, fail(abi.StatusInvalidValue, "reserving [%#x, +%d): %v", addr, r.Size, err)
	}
	return &abi.AllocReply{Ptr: addr}, nil
}

// placeReservation takes size bytes of the window's space for a
// reservation and returns where.
func (m *Memory) placeReservation(size, align, hint uint64) (uint64, bool) {
	if m.placed != 0 {
		addr := m.placed
		m.placed = 0
		return addr, m.inWindow(addr, size) && m.space.Insert(addr, size) == nil
	}
	if hint != 0 && hint%align == 0 && m.inWindow(hint, size) && m.space.Insert(hint, size) == nil {
		return hint, true
	}
	addr, ok := m.space.FirstFit(m.base, m.size, size, align)
	return addr, ok && m.space.Insert(addr, size) == nil
}

// inWindow reports whether [addr, addr+n) lies in the window.
func (m *Memory) inWindow(addr, n uint64) bool {
	return addr >= m.base && n <= m.size && addr-m.base <= m.size-n
}

// AddressFree frees a reservation, named by its exact range, that holds
// no mapping.
func (m *Memory) AddressFree(r *abi.AddressFree) (abi.Body, error) {
	res, ok := m.reserved.Find(r.Ptr, 0)
	if !ok || res.Addr != r.Ptr || res.Size != r.Size {
		return nil, fail(abi.StatusInvalidValue, "address free: no reservation of %d bytes starts at %#x", r.Size, r.Ptr)
	}
	if m.mappedIn(res) {
		return nil, fail(abi.StatusInvalidValue, "address free: the reservation at %#x still has mappings (unmap them first)", r.Ptr)
	}
	m.reserved.Remove(res.Addr)
	m.space.Remove(res.Addr)
	return nil, nil
}

// mappedIn reports whether any mapping lies in res.
func (m *Memory) mappedIn(res handlemap.Range) bool {
	for addr := range m.mapped {
		if addr >= res.Addr && addr < res.End() {
			return true
		}
	}
	return false
}

// MemMap backs exactly [Ptr, Ptr+Size) with device memory: the range
// must be granularity-aligned, inside one reservation and over no other
// mapping, and fit the session's and its tenant's quotas.
func (m *Memory) MemMap(r *abi.MemMap) (abi.Body, error) {
	if r.Size == 0 || r.Size%m.cfg.AllocAlign != 0 || r.Ptr%m.cfg.AllocAlign != 0 {
		return nil, fail(abi.StatusInvalidValue, "map of %d bytes at %#x: address and size must be multiples of the %d-byte granularity", r.Size, r.Ptr, m.cfg.AllocAlign)
	}
	if _, ok := m.reserved.Find(r.Ptr, r.Size); !ok {
		return nil, fail(abi.StatusOutOfRange, "map of %d bytes at %#x: not inside one of this session's reserved ranges", r.Size, r.Ptr)
	}
	if _, ok := m.ranges.Find(r.Ptr, 0); ok || m.overlapsMapping(r.Ptr, r.Size) {
		return nil, fail(abi.StatusInvalidValue, "map of %d bytes at %#x: the range is already mapped", r.Size, r.Ptr)
	}
	if r.Size > m.cfg.MemoryQuota-m.ranges.Total() {
		return nil, fail(abi.StatusOutOfMemory, "map of %d bytes exceeds the session quota (%d of %d bytes in use; --guest.memory-quota-bytes)",
			r.Size, m.ranges.Total(), m.cfg.MemoryQuota)
	}
	if err := m.objs.CheckRoom(); err != nil {
		return nil, err
	}
	if err := m.tenant.Reserve(r.Size); err != nil {
		return nil, err
	}
	if err := m.ctx.Alloc(m.dev(r.Ptr), r.Size); err != nil {
		m.tenant.Release(r.Size)
		return nil, err
	}
	if err := m.ranges.Insert(r.Ptr, r.Size); err != nil { // cannot happen: checked above
		m.ctx.Free(m.dev(r.Ptr))
		m.tenant.Release(r.Size)
		return nil, fail(abi.StatusInvalidValue, "recording mapping: %v", err)
	}
	if m.mapped == nil {
		m.mapped = map[uint64]bool{}
	}
	m.mapped[r.Ptr] = true
	return nil, nil
}

// overlapsMapping reports whether [addr, addr+n) (checked to lie in the
// window) overlaps any allocation or mapping.
func (m *Memory) overlapsMapping(addr, n uint64) bool {
	for _, rg := range m.ranges.All() {
		if rg.Addr < addr+n && addr < rg.End() {
			return true
		}
	}
	return false
}

// MemUnmap unmaps [Ptr, Ptr+Size): whole mappings that follow one another
// from Ptr, and frees their memory. Nothing changes unless all of it is.
func (m *Memory) MemUnmap(r *abi.MemUnmap) (abi.Body, error) {
	pieces, ok := m.mappedPieces(r.Ptr, r.Size)
	if !ok || r.Size == 0 || pieces[0].Addr != r.Ptr || pieces[len(pieces)-1].End() != r.Ptr+r.Size {
		return nil, fail(abi.StatusInvalidValue, "unmap of %d bytes at %#x: not whole mappings of this session", r.Size, r.Ptr)
	}
	for _, p := range pieces {
		if err := m.ctx.Free(m.dev(p.Addr)); err != nil {
			return nil, err
		}
		m.ranges.Remove(p.Addr)
		delete(m.mapped, p.Addr)
		m.tenant.Release(p.Size)
	}
	return nil, nil
}

// mappedPieces returns the mappings that hold [addr, addr+n), in order,
// when mappings that follow one another hold all of it (n zero: the one
// holding addr).
func (m *Memory) mappedPieces(addr, n uint64) ([]handlemap.Range, bool) {
	if _, over := bits.Add64(addr, n, 0); over != 0 {
		return nil, false
	}
	var pieces []handlemap.Range
	for at, end := addr, addr+n; at < end || len(pieces) == 0; {
		rg, ok := m.ranges.Find(at, 0)
		if !ok || !m.mapped[rg.Addr] {
			return nil, false
		}
		pieces = append(pieces, rg)
		at = rg.End()
	}
	return pieces, true
}

// spans reports whether [addr, addr+n) lies in one allocation, or in
// mappings that follow one another: memory a request may name.
func (m *Memory) spans(addr, n uint64) bool {
	if _, ok := m.ranges.Find(addr, n); ok {
		return true
	}
	_, ok := m.mappedPieces(addr, n)
	return ok
}

// MappingRecords are the requests that recreate the session's
// reservations (placed where they are) and mappings on a standby, in
// that order; their contents follow as those of any allocation.
func (m *Memory) MappingRecords(placed func(op abi.Opcode, body abi.Body, addr uint64)) {
	for _, r := range m.reserved.All() {
		placed(abi.OpAddressReserve, &abi.AddressReserve{Size: r.Size}, r.Addr)
	}
	for _, r := range m.ranges.All() {
		if m.mapped[r.Addr] {
			placed(abi.OpMemMap, &abi.MemMap{Ptr: r.Addr, Size: r.Size}, 0)
		}
	}
}
