package cuapi

import (
	"fmt"
	"os"

	"github.com/vgpuha/vgpuha/pvdriver"
)

// Virtual memory management (CUDA Driver API reference, "Virtual Memory
// Management"): what JAX's XLA requires and PyTorch's expandable segments
// use. The node owns the address space: a reservation (cuMemAddressReserve)
// and a mapping (cuMemMap) are requests it executes in the session's
// window (pvdriver/abi's vmm.go), so a standby replays them and holds the
// same ranges at the same addresses. A physical allocation handle
// (cuMemCreate) is this driver's alone: a size and its properties, given
// device memory only once mapped. Hence what differs from CUDA:
//
//   - A handle maps once, whole or a prefix, at offset 0. A second mapping of a
//     handle, a mapping at an offset, or one of a handle mapped before and
//     unmapped since (unmapping frees the memory, so its contents are
//     gone) is refused with CUDA_ERROR_NOT_SUPPORTED, named on stderr under
//     VGPUHA_DEBUG.
//   - Memory is taken from the quotas when mapped, so a session's quota
//     refuses cuMemMap (CUDA_ERROR_OUT_OF_MEMORY), not cuMemCreate.
//   - Mappings are readable and writable by the device from cuMemMap on;
//     cuMemSetAccess accepts read-write access for the device (and only
//     that) over mapped ranges, and cuMemGetAccess reports what it set.
//   - Handles are never exported or imported (no shareable handles):
//     cuMemExportToShareableHandle is refused and the device's handle-type
//     attributes read 0. cuMemCreate still accepts a request for a POSIX
//     file descriptor, the one type PyTorch's expandable segments and
//     XLA ask for whatever those attributes say (PyTorch with no retry
//     without it); any other handle type is refused.
//
// A handle released while mapped stays until unmapped, as in CUDA.

// CUmemAllocationProp's values this driver serves.
const (
	memAllocationTypePinned = 1 // CU_MEM_ALLOCATION_TYPE_PINNED
	memLocationTypeDevice   = 1 // CU_MEM_LOCATION_TYPE_DEVICE
	memAccessReadWrite      = 3 // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
	memHandleTypePosixFD    = 1 // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
	defaultGranularity      = 2 << 20
)

// AllocProp is what this driver reads of a CUmemAllocationProp.
type AllocProp struct {
	Type, HandleTypes, LocationType, LocationID int32
	Compression                                 uint8
	Usage                                       uint16
}

// memHandle is a physical allocation handle (CUmemGenericAllocationHandle).
type memHandle struct {
	size   uint64
	prop   AllocProp
	refs   int    // cuMemCreate's and every cuMemRetainAllocationHandle's, less releases
	mapped uint64 // where it is mapped; zero: not mapped
	used   bool   // it was mapped once (its memory went with the unmap)
}

// vmMapping is a range backed by a handle (cuMemMap).
type vmMapping struct {
	size   uint64
	handle uint64
	ctx    uint64
	access bool // cuMemSetAccess gave the device read-write access
}

// vmmRefusal names a refusal of something this driver does not serve
// (under VGPUHA_DEBUG) and returns CUDA_ERROR_NOT_SUPPORTED.
func vmmRefusal(call, format string, args ...any) Result {
	if os.Getenv("VGPUHA_DEBUG") != "" {
		fmt.Fprintf(os.Stderr, "vgpuha libcuda: %s: %s (CUDA_ERROR_NOT_SUPPORTED)\n", call, fmt.Sprintf(format, args...))
	}
	return ErrorNotSupported
}

// checkProp checks a CUmemAllocationProp against what this driver serves.
func checkProp(call string, p AllocProp) Result {
	switch {
	case p.Type != memAllocationTypePinned:
		return vmmRefusal(call, "allocation type %d (only CU_MEM_ALLOCATION_TYPE_PINNED is served)", p.Type)
	case p.LocationType != memLocationTypeDevice:
		return vmmRefusal(call, "location type %d (only CU_MEM_LOCATION_TYPE_DEVICE is served)", p.LocationType)
	case p.LocationID != 0:
		return ErrorInvalidDevice
	case p.HandleTypes&^memHandleTypePosixFD != 0:
		return vmmRefusal(call, "requested handle types %#x (no handle is exported here; a POSIX file descriptor is accepted and its export refused)", p.HandleTypes)
	case p.Compression != 0 || p.Usage != 0:
		return vmmRefusal(call, "compression %d, usage %d (neither is served)", p.Compression, p.Usage)
	}
	return Success
}

// granularity is the node's allocation granularity.
// Precondition: d.mu must be locked.
func (d *Driver) granularity() uint64 {
	if d.dev.Granularity != 0 {
		return d.dev.Granularity
	}
	return defaultGranularity
}

// MemGetAllocationGranularity is cuMemGetAllocationGranularity: minimum
// and recommended are both the node's granularity.
func (d *Driver) MemGetAllocationGranularity(p AllocProp, option uint32) (uint64, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.ready(); r != Success {
		return 0, r
	}
	if option > 1 {
		return 0, ErrorInvalidValue
	}
	p.HandleTypes = 0 // asking what a handle type would need is no export
	if r := checkProp("cuMemGetAllocationGranularity", p); r != Success {
		return 0, r
	}
	return d.granularity(), Success
}

// MemAddressReserve is cuMemAddressReserve: size bytes of the session's
// window, aligned to align (zero: the granularity), at hint if the node
// can (CUDA too takes it as a hint).
func (d *Driver) MemAddressReserve(size, align, hint, flags uint64) (uint64, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.ready(); r != Success {
		return 0, r
	}
	if size == 0 || size%d.granularity() != 0 || flags != 0 || align&(align-1) != 0 {
		return 0, ErrorInvalidValue
	}
	p, err := d.client.ReserveAddress(size, align, hint)
	if err != nil {
		return 0, resultOf("cuMemAddressReserve", err, false)
	}
	return uint64(p), Success
}

// MemAddressFree is cuMemAddressFree: the whole of a reservation, with
// nothing mapped in it.
func (d *Driver) MemAddressFree(p, size uint64) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.ready(); r != Success {
		return r
	}
	return resultOf("cuMemAddressFree", d.client.FreeAddress(pvdriver.DevicePtr(p), size), false)
}

// MemCreate is cuMemCreate: a handle of size bytes (a multiple of the
// granularity) with properties p; no memory is taken until it is mapped.
func (d *Driver) MemCreate(size uint64, p AllocProp, flags uint64) (uint64, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.ready(); r != Success {
		return 0, r
	}
	if size == 0 || size%d.granularity() != 0 || flags != 0 {
		return 0, ErrorInvalidValue
	}
	if r := checkProp("cuMemCreate", p); r != Success {
		return 0, r
	}
	if d.memHandles == nil {
		d.memHandles, d.mappings = map[uint64]*memHandle{}, map[uint64]*vmMapping{}
	}
	h := d.mint()
	d.memHandles[h] = &memHandle{size: size, prop: p, refs: 1}
	return h, Success
}

// MemRelease is cuMemRelease: a handle still mapped lives on until it is
// unmapped.
func (d *Driver) MemRelease(h uint64) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.ready(); r != Success {
		return r
	}
	mh := d.memHandles[h]
	if mh == nil || mh.refs == 0 {
		return ErrorInvalidValue
	}
	mh.refs--
	d.dropHandle(h)
	return Success
}

// dropHandle forgets handle h once it is neither held nor mapped.
// Precondition: d.mu must be locked.
func (d *Driver) dropHandle(h uint64) {
	if mh := d.memHandles[h]; mh != nil && mh.refs == 0 && mh.mapped == 0 {
		delete(d.memHandles, h)
	}
}

// MemMap is cuMemMap: handle h backs [p, p+size) (size at most the
// handle's, offset 0), inside a reservation of the calling process.
func (d *Driver) MemMap(t Thread, p, size, offset, h, flags uint64) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.ready(); r != Success {
		return r
	}
	mh := d.memHandles[h]
	switch {
	case mh == nil || mh.refs == 0 || size == 0 || flags != 0 || size%d.granularity() != 0:
		return ErrorInvalidValue
	case offset != 0:
		return vmmRefusal("cuMemMap", "offset %d into a handle (only offset 0 is served)", offset)
	case size > mh.size:
		return ErrorInvalidValue
	case mh.mapped != 0 || mh.used:
		return vmmRefusal("cuMemMap", "handle %#x mapped a second time (a handle maps once here)", h)
	}
	if err := d.client.Map(pvdriver.DevicePtr(p), size); err != nil {
		return resultOf("cuMemMap", err, false)
	}
	mh.mapped, mh.used = p, true
	d.mappings[p] = &vmMapping{size: size, handle: h, ctx: t.Top()}
	d.used += size
	return Success
}

// mappingsIn returns the addresses of the mappings that make up exactly
// [p, p+size), in order; nil unless mappings that follow one another
// cover it.
// Precondition: d.mu must be locked.
func (d *Driver) mappingsIn(p, size uint64) []uint64 {
	var at []uint64
	for addr, end := p, p+size; addr < end; {
		m := d.mappings[addr]
		if m == nil || end < addr || m.size > end-addr {
			return nil
		}
		at = append(at, addr)
		addr += m.size
	}
	return at
}

// MemUnmap is cuMemUnmap: [p, p+size) must be whole mappings; their
// memory is freed.
func (d *Driver) MemUnmap(p, size uint64) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.ready(); r != Success {
		return r
	}
	at := d.mappingsIn(p, size)
	if at == nil {
		return ErrorInvalidValue
	}
	if err := d.client.Unmap(pvdriver.DevicePtr(p), size); err != nil {
		return resultOf("cuMemUnmap", err, false)
	}
	for _, a := range at {
		m := d.mappings[a]
		delete(d.mappings, a)
		d.used -= m.size
		if mh := d.memHandles[m.handle]; mh != nil {
			mh.mapped = 0
			d.dropHandle(m.handle)
		}
	}
	return Success
}

// AccessDesc is a CUmemAccessDesc.
type AccessDesc struct{ LocationType, LocationID, Flags int32 }

// MemSetAccess is cuMemSetAccess: read-write access for the device over
// mapped memory (it has it from cuMemMap on); any other access is not
// served.
func (d *Driver) MemSetAccess(p, size uint64, descs []AccessDesc) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.ready(); r != Success {
		return r
	}
	if len(descs) == 0 {
		return ErrorInvalidValue
	}
	for _, a := range descs {
		switch {
		case a.LocationType != memLocationTypeDevice:
			return vmmRefusal("cuMemSetAccess", "location type %d (only the device's access is served)", a.LocationType)
		case a.LocationID != 0:
			return ErrorInvalidDevice
		case a.Flags != memAccessReadWrite:
			return vmmRefusal("cuMemSetAccess", "access flags %d (only CU_MEM_ACCESS_FLAGS_PROT_READWRITE is served)", a.Flags)
		}
	}
	at := d.mappingsIn(p, size)
	if at == nil {
		return ErrorInvalidValue
	}
	for _, a := range at {
		d.mappings[a].access = true
	}
	return Success
}

// MemGetAccess is cuMemGetAccess: the device's access to the mapping
// holding p.
func (d *Driver) MemGetAccess(locType, locID int32, p uint64) (uint64, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.ready(); r != Success {
		return 0, r
	}
	if locType != memLocationTypeDevice || locID != 0 {
		return 0, ErrorInvalidValue
	}
	base, m := d.mappingAt(p)
	if m == nil || base == 0 {
		return 0, ErrorInvalidValue
	}
	if m.access {
		return memAccessReadWrite, Success
	}
	return 0, Success
}

// mappingAt returns the mapping holding p and where it starts.
// Precondition: d.mu must be locked.
func (d *Driver) mappingAt(p uint64) (uint64, *vmMapping) {
	for base, m := range d.mappings {
		if p >= base && p-base < m.size {
			return base, m
		}
	}
	return 0, nil
}

// MemRetainAllocationHandle is cuMemRetainAllocationHandle: the handle
// mapped at p, held once more (a cuMemRelease each).
func (d *Driver) MemRetainAllocationHandle(p uint64) (uint64, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.ready(); r != Success {
		return 0, r
	}
	_, m := d.mappingAt(p)
	if m == nil {
		return 0, ErrorInvalidValue
	}
	d.memHandles[m.handle].refs++
	return m.handle, Success
}

// MemAllocationProp is cuMemGetAllocationPropertiesFromHandle.
func (d *Driver) MemAllocationProp(h uint64) (AllocProp, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.ready(); r != Success {
		return AllocProp{}, r
	}
	mh := d.memHandles[h]
	if mh == nil {
		return AllocProp{}, ErrorInvalidValue
	}
	return mh.prop, Success
}

// mappedPointer describes the mapping holding p, if any.
// Precondition: d.mu must be locked.
func (d *Driver) mappedPointer(p uint64) (PointerInfo, bool) {
	base, m := d.mappingAt(p)
	if m == nil {
		return PointerInfo{}, false
	}
	return PointerInfo{Kind: MemoryDevice, Ctx: m.ctx, Base: base, Size: m.size}, true
}
