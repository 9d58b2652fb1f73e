package cuda

import (
	"errors"
	"fmt"
	"sort"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// A CUDA memory snapshot is a device-to-device copy of the ranges into
// staging memory of the same context (cuMemAlloc + cuMemcpyDtoD): an H100
// copies at over 1 TB/s, so 4 GiB costs milliseconds of guest pause, where
// reading it over PCIe and the link costs seconds. The copy is bracketed by
// cuCtxSynchronize: work a guest queued before the snapshot is in it, and
// nothing the guest queues after can reach it. When the device has no room
// for the staging copy, SnapshotMemory fails and the hypervisor copies
// that session the old way, with it stopped.
//
// Reads (cuMemcpyDtoH from staging) take the context's lock like any call.
// They are on the legacy null stream, so a read waits for work queued on
// the guest's blocking streams; a non-blocking stream and
// cuMemcpyDtoHAsync into page-locked memory would let reads overlap a
// guest's kernels. Not yet measured on a GPU.

var errReleased = errors.New("cuda: memory snapshot released")

// memSnapshot implements gpu.MemorySnapshot.
type memSnapshot struct {
	c        *guestContext
	parts    []stagedRange // sorted by addr
	released bool          // guarded by c.mu
}

// stagedRange is a range's contents at the snapshot, in staging memory.
type stagedRange struct {
	addr, size uint64
	staging    uint64 // device pointer from cuMemAlloc
}

// SnapshotMemory implements gpu.Snapshotter.
func (c *guestContext) SnapshotMemory(ranges []gpu.Range) (gpu.MemorySnapshot, error) {
	s := &memSnapshot{c: c}
	err := c.do(func() error {
		if c.snap != nil {
			c.snap.releaseLocked()
		}
		d := c.d
		if err := d.check("cuCtxSynchronize", d.cuCtxSynchronize()); err != nil {
			return err
		}
		for _, r := range ranges {
			if err := c.inWindow(r.Addr, r.Size); err != nil {
				return err
			}
			part := stagedRange{addr: r.Addr, size: r.Size}
			if err := d.check("cuMemAlloc(snapshot staging)", d.cuMemAlloc(&part.staging, r.Size)); err != nil {
				return err
			}
			s.parts = append(s.parts, part)
			if err := d.check("cuMemcpyDtoD(snapshot)", d.cuMemcpyDtoD(part.staging, r.Addr, r.Size)); err != nil {
				return err
			}
		}
		return d.check("cuCtxSynchronize", d.cuCtxSynchronize())
	})
	if err != nil {
		c.do(func() error { s.releaseLocked(); return nil })
		return nil, err
	}
	sort.Slice(s.parts, func(i, j int) bool { return s.parts[i].addr < s.parts[j].addr })
	c.mu.Lock()
	c.snap = s
	c.mu.Unlock()
	return s, nil
}

// ReadAt implements gpu.MemorySnapshot.
func (s *memSnapshot) ReadAt(p []byte, addr uint64) error {
	return s.c.do(func() error {
		if s.released {
			return errReleased
		}
		i := sort.Search(len(s.parts), func(i int) bool { return s.parts[i].addr > addr }) - 1
		if i < 0 || addr-s.parts[i].addr+uint64(len(p)) > s.parts[i].size {
			return fmt.Errorf("%w: %d bytes at %#x are not in the snapshot", abi.StatusOutOfRange, len(p), addr)
		}
		part := s.parts[i]
		return s.c.d.check("cuMemcpyDtoH(snapshot)", s.c.d.memcpyDtoH(p, part.staging+addr-part.addr))
	})
}

// Release implements gpu.MemorySnapshot.
func (s *memSnapshot) Release() {
	s.c.do(func() error { s.releaseLocked(); return nil })
}

// releaseLocked frees the staging memory (a context already destroyed took
// it with it; the errors are then expected and ignored).
// Precondition: s.c.mu must be locked, the context current.
func (s *memSnapshot) releaseLocked() {
	if s.released {
		return
	}
	s.released = true
	for _, part := range s.parts {
		s.c.d.cuMemFree(part.staging)
	}
	s.parts = nil
	if s.c.snap == s {
		s.c.snap = nil
	}
}
