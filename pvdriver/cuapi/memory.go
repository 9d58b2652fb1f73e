package cuapi

import (
	"math/bits"

	"github.com/vgpuha/vgpuha/pvdriver"
)

// pitchAlign is the row alignment cuMemAllocPitch gives (CUDA's texture
// pitch alignment on current GPUs).
const pitchAlign = 512

// MemAlloc is cuMemAlloc_v2.
func (d *Driver) MemAlloc(t Thread, n uint64) (uint64, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ctx, r := d.current(t)
	if r != Success {
		return 0, r
	}
	if n == 0 {
		return 0, ErrorInvalidValue
	}
	p, err := d.client.Alloc(n)
	if err != nil {
		return 0, resultOf("cuMemAlloc", err, false)
	}
	d.allocs[uint64(p)] = allocation{size: n, ctx: ctx}
	d.used += n
	return uint64(p), Success
}

// MemAllocPitch is cuMemAllocPitch_v2: rows of width bytes padded to the
// pitch alignment; elemSize must be 4, 8 or 16.
func (d *Driver) MemAllocPitch(t Thread, width, height uint64, elemSize uint32) (ptr, pitch uint64, r Result) {
	if width == 0 || height == 0 || elemSize != 4 && elemSize != 8 && elemSize != 16 {
		return 0, 0, ErrorInvalidValue
	}
	if width > 1<<62 {
		return 0, 0, ErrorInvalidValue
	}
	pitch = (width + pitchAlign - 1) / pitchAlign * pitchAlign
	hi, total := bits.Mul64(pitch, height)
	if hi != 0 {
		return 0, 0, ErrorOutOfMemory
	}
	ptr, r = d.MemAlloc(t, total)
	return ptr, pitch, r
}

// MemFree is cuMemFree_v2; freeing 0 does nothing, as in CUDA (the
// runtime's cudaFree(0), the usual way to make a context, comes here).
func (d *Driver) MemFree(t Thread, p uint64) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, r := d.current(t); r != Success || p == 0 {
		return r
	}
	return d.freeLocked(p)
}

// freeLocked frees the allocation at p and forgets it.
// Precondition: d.mu must be locked and d.client set.
func (d *Driver) freeLocked(p uint64) Result {
	a, ok := d.allocs[p]
	if !ok {
		return ErrorInvalidValue
	}
	if err := d.client.Free(pvdriver.DevicePtr(p)); err != nil {
		return resultOf("cuMemFree", err, false)
	}
	delete(d.allocs, p)
	d.used -= a.size
	return Success
}

// MemGetInfo is cuMemGetInfo_v2: the device's memory as of the snapshot,
// less what this process holds (other tenants' use is not visible).
func (d *Driver) MemGetInfo(t Thread) (free, total uint64, r Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, r := d.current(t); r != Success {
		return 0, 0, r
	}
	total = d.dev.TotalMem
	if d.used < total {
		free = total - d.used
	}
	return free, total, Success
}

// IsDevice reports whether [p, p+n) lies in the session's device window:
// how cuMemcpy tells device from host addresses (unified addressing).
func (d *Driver) IsDevice(p, n uint64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.client != nil && p >= d.base && p-d.base < d.size && n <= d.size-(p-d.base)
}

// copyTarget validates the context and stream of a copy or memset and
// returns the client and the stream to queue it on.
func (d *Driver) copyTarget(t Thread, s uint64) (*pvdriver.Client, pvdriver.Stream, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, r := d.current(t); r != Success {
		return nil, 0, r
	}
	st, r := d.stream(s)
	return d.client, st, r
}

// MemcpyHtoD is cuMemcpyHtoD_v2 and, with async, cuMemcpyHtoDAsync_v2 on
// stream s. src is copied before the call returns, so an async copy from
// pageable memory is as safe as from pinned memory; from host memory of
// the session's region (cuMemAllocHost) the device may read it until the
// stream is synchronised, as CUDA's rule for pinned memory says.
func (d *Driver) MemcpyHtoD(t Thread, dst uint64, src []byte, s uint64, async bool) Result {
	dst = d.deviceAddress(t, dst)
	if r, ok := d.captured(s, graphNode{kind: nodeCopyHtoD, dst: dst, host: src}, dst, uint64(len(src))); ok {
		return r
	}
	if r, ok := d.copyGlobal(t, dst, src, true); ok {
		return r
	}
	c, st, r := d.copyTarget(t, s)
	if r != Success || len(src) == 0 {
		return r
	}
	if r := d.beforeWork(c); r != Success {
		return r
	}
	if async {
		return resultOf("cuMemcpyHtoDAsync", c.CopyHtoDAsync(pvdriver.DevicePtr(dst), src, st), false)
	}
	return resultOf("cuMemcpyHtoD", c.CopyHtoD(pvdriver.DevicePtr(dst), src), false)
}

// MemcpyDtoH is cuMemcpyDtoH_v2 and cuMemcpyDtoHAsync_v2. Both complete
// before returning: the copy is ordered after all earlier work (the null
// stream's order, which includes stream s's).
func (d *Driver) MemcpyDtoH(t Thread, dst []byte, src uint64, s uint64) Result {
	src = d.deviceAddress(t, src)
	if r, ok := d.captured(s, graphNode{kind: nodeCopyDtoH, src: src, host: dst}, src, uint64(len(dst))); ok {
		return r
	}
	if r, ok := d.copyGlobal(t, src, dst, false); ok {
		return r
	}
	c, _, r := d.copyTarget(t, s)
	if r != Success || len(dst) == 0 {
		return r
	}
	if r := d.beforeWork(c); r != Success {
		return r
	}
	return d.waitAndPull(c, "cuMemcpyDtoH", coversAll, func(reads []pvdriver.Read) error {
		return c.CopyDtoHThenRead(dst, pvdriver.DevicePtr(src), reads)
	})
}

// MemcpyDtoD is cuMemcpyDtoD_v2 and cuMemcpyDtoDAsync_v2.
func (d *Driver) MemcpyDtoD(t Thread, dst, src, n, s uint64, async bool) Result {
	dst, src = d.deviceAddress(t, dst), d.deviceAddress(t, src)
	if r, ok := d.captured(s, graphNode{kind: nodeCopyDtoD, dst: dst, src: src, n: n}, dst, n); ok {
		return r
	}
	if d.IsGlobal(dst, n) || d.IsGlobal(src, n) {
		return d.copyThroughHost(t, dst, src, n, s)
	}
	c, st, r := d.copyTarget(t, s)
	if r != Success || n == 0 {
		return r
	}
	if r := d.beforeWork(c); r != Success {
		return r
	}
	if async {
		return resultOf("cuMemcpyDtoDAsync", c.CopyDtoDAsync(pvdriver.DevicePtr(dst), pvdriver.DevicePtr(src), n, st), false)
	}
	return resultOf("cuMemcpyDtoD", c.CopyDtoD(pvdriver.DevicePtr(dst), pvdriver.DevicePtr(src), n), false)
}

// Memset is cuMemsetD8_v2/D16_v2/D32_v2 and their Async forms: count
// elements of width bytes; the destination must be aligned to width.
func (d *Driver) Memset(t Thread, dst uint64, width uint8, v uint32, count, s uint64, async bool) Result {
	dst = d.deviceAddress(t, dst)
	c, st, r := d.copyTarget(t, s)
	if r != Success {
		return r
	}
	if dst%uint64(width) != 0 {
		return ErrorInvalidValue
	}
	if count == 0 {
		return Success
	}
	if hi, n := bits.Mul64(count, uint64(width)); hi == 0 {
		if r, ok := d.captured(s, graphNode{kind: nodeMemset, dst: dst, width: width, value: v, count: count}, dst, n); ok {
			return r
		}
	}
	if hi, n := bits.Mul64(count, uint64(width)); hi == 0 && d.IsGlobal(dst, n) {
		pattern := [4]byte{byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24)}
		buf := make([]byte, n)
		for i := range buf {
			buf[i] = pattern[i%int(width)]
		}
		r, _ := d.copyGlobal(t, dst, buf, true)
		return r
	}
	if r := d.beforeWork(c); r != Success {
		return r
	}
	return resultOf("cuMemset", c.Memset(pvdriver.DevicePtr(dst), width, v, count, st, !async), false)
}

// HostAllocCheck checks that n bytes of host memory may be allocated
// (cuMemAllocHost_v2, cuMemHostAlloc). The C half then asks
// HostAllocRegion for them, else allocates ordinary memory, page aligned;
// either way it notes them with NoteHost.
func (d *Driver) HostAllocCheck(t Thread, n uint64) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, r := d.current(t); r != Success {
		return r
	}
	if n == 0 || n > 1<<46 {
		return ErrorInvalidValue
	}
	return Success
}

// HostAllocRegion returns n bytes of the session's host-memory region
// (pvdriver.Client.AllocHost: over shared memory, memory the node
// page-locks, so copies from and to it run at the GPU's DMA rate), or nil
// when there is no region or no room in it: ordinary memory then serves,
// and its copies travel inline.
func (d *Driver) HostAllocRegion(n uint64) []byte {
	d.mu.Lock()
	c := d.client
	d.mu.Unlock()
	if c == nil || n > 1<<46 {
		return nil
	}
	b, err := c.AllocHost(int(n))
	if err != nil {
		return nil
	}
	return b
}

// HostFree checks and forgets host memory at p (cuMemFreeHost); a buffer
// of the region goes back to it, ordinary memory the C half frees when
// cFree is set. Its mirror on the device, if it had one, goes with it.
func (d *Driver) HostFree(p uintptr) (r Result, cFree bool) {
	if r, cFree = d.hostFree(p); r == Success {
		d.dropMirror(p)
	}
	return r, cFree
}

func (d *Driver) hostFree(p uintptr) (r Result, cFree bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.ready(); r != Success {
		return r, false
	}
	h, ok := d.hosts[p]
	if !ok || h.registered {
		return ErrorInvalidValue, false
	}
	d.forgetHostLocked(p)
	if h.region != nil {
		if err := d.client.FreeHost(h.region); err != nil {
			return resultOf("cuMemFreeHost", err, false), false
		}
		return Success, false
	}
	return Success, true
}
