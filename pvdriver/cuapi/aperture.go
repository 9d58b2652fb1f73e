package cuapi

import (
	"errors"

	"github.com/vgpuha/vgpuha/pvdriver"
)

// Apertures are vgpuha's one extension to the driver API
// (vgpuhaMemMapAperture, vgpuhaMemUnmapAperture): device memory mapped
// into the program, so that plain CPU stores reach the device — and the
// standby — with no call, as they would to a GPU's BAR. The node traces
// the stores (package mmiotrace); a store it cannot replicate fails in the
// program at that store, never silently. A CUDA program that does not call
// them sees NVIDIA's API unchanged.

// MapAperture maps n bytes (rounded up to pages) of new device memory into
// the program: kind 0 is memory (writes may be batched per page), 1 a
// register page (each write replicated in order). It returns the device
// address and the program's view of it. The memory is freed by
// UnmapAperture, not cuMemFree.
func (d *Driver) MapAperture(t Thread, n uint64, kind uint32) (uint64, []byte, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, r := d.current(t); r != Success {
		return 0, nil, r
	}
	k := map[uint32]pvdriver.ApertureKind{0: pvdriver.Memory, 1: pvdriver.Register}
	kk, ok := k[kind]
	if !ok || n == 0 || n > 1<<34 {
		return 0, nil, ErrorInvalidValue
	}
	a, err := d.client.MapAperture(n, kk)
	if errors.Is(err, pvdriver.ErrAperturesUnsupported) {
		return 0, nil, ErrorNotSupported
	}
	if err != nil {
		return 0, nil, resultOf("vgpuhaMemMapAperture", err, true)
	}
	if d.apertures == nil {
		d.apertures = map[uint64]*pvdriver.Aperture{}
	}
	d.apertures[uint64(a.Ptr)] = a
	return uint64(a.Ptr), a.Mem, Success
}

// UnmapAperture unmaps the aperture at device address p and frees its
// device memory; the program's view of it is gone.
func (d *Driver) UnmapAperture(t Thread, p uint64) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, r := d.current(t); r != Success {
		return r
	}
	a, ok := d.apertures[p]
	if !ok {
		return ErrorInvalidValue
	}
	delete(d.apertures, p)
	return resultOf("vgpuhaMemUnmapAperture", a.Close(), false)
}
