package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"sort"
	"sync"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// A CUDA memory snapshot is a device-to-device copy of the ranges into
// staging memory of the same context (one cuMemAlloc, a cuMemcpyDtoDAsync
// per range on the null stream): an H100
// copies at over 1 TB/s, so 4 GiB costs milliseconds of guest pause, where
// reading it over PCIe and the link costs seconds. The copy is bracketed by
// cuCtxSynchronize: work a guest queued before the snapshot is in it, and
// nothing the guest queues after can reach it. When the device has no room
// for the staging copy, SnapshotMemory fails and the hypervisor copies
// that session the old way, with it stopped.
//
// Reads copy from staging on a non-blocking stream of the snapshot's own
// (cuMemcpyDtoHAsync, then cuStreamSynchronize), without the context's
// lock: a guest's calls neither wait for a read nor are waited for by one
// (the legacy null stream would order a read after every blocking stream's
// work and take the lock for the whole copy). Measured on an H100 with
// primary and standby as processes of their own, 16 GiB, the two ways
// alternating: guests kept 0.31 and 0.35 of their call rate during a
// resync with reads under the lock on the null stream, 0.29 and 0.36
// with this: no difference (what held guests back was the log's resync
// budget). The lock is taken only to look the range up and to count the
// read; releasing the snapshot (or closing the context) waits until no
// read is under way before it frees the staging memory.

var errReleased = errors.New("cuda: memory snapshot released")

// memSnapshot implements gpu.MemorySnapshot.
type memSnapshot struct {
	c     *guestContext
	parts []stagedRange // sorted by addr
	// staging is one allocation holding every part: one driver call with
	// guests stopped, however many allocations they hold (the driver's
	// allocations take a lock other processes' calls can hold for
	// milliseconds: a standby starting on the same host).
	staging uint64
	stream  uintptr // non-blocking, for reads
	// released, and reading (reads under way), are guarded by c.mu;
	// idle is signalled when reading drops to 0.
	released bool
	reading  int
	idle     *sync.Cond
}

// stagedRange is a range's contents at the snapshot, in staging memory.
type stagedRange struct {
	addr, size uint64
	staging    uint64 // its place in memSnapshot.staging
}

// stagingAlign keeps every staged range at an aligned device address.
const stagingAlign = 512

// SnapshotMemory implements gpu.Snapshotter.
func (c *guestContext) SnapshotMemory(ranges []gpu.Range) (gpu.MemorySnapshot, error) {
	s := &memSnapshot{c: c, idle: sync.NewCond(&c.mu)}
	err := c.do(func() error {
		if c.snap != nil {
			c.snap.releaseLocked()
		}
		d := c.d
		if err := d.check("cuStreamCreate(snapshot)", d.cuStreamCreate(&s.stream, streamNonBlocking)); err != nil {
			return err
		}
		if err := d.check("cuCtxSynchronize", d.cuCtxSynchronize()); err != nil {
			return err
		}
		var total uint64
		for _, r := range ranges {
			if err := c.inWindow(r.Addr, r.Size); err != nil {
				return err
			}
			total += roundUp(r.Size, stagingAlign)
		}
		if err := d.check("cuMemAlloc(snapshot staging)", d.cuMemAlloc(&s.staging, total)); err != nil {
			return err
		}
		at := s.staging
		for _, r := range ranges {
			part := stagedRange{addr: r.Addr, size: r.Size, staging: at}
			at += roundUp(r.Size, stagingAlign)
			s.parts = append(s.parts, part)
			if err := d.check("cuMemcpyDtoDAsync(snapshot)", d.cuMemcpyDtoDAsync(part.staging, r.Addr, r.Size, 0)); err != nil {
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

// streamNonBlocking is CU_STREAM_NON_BLOCKING: the stream does not
// synchronise with the legacy null stream.
const streamNonBlocking = 1

// ReadAt implements gpu.MemorySnapshot.
func (s *memSnapshot) ReadAt(p []byte, addr uint64) error {
	src, err := s.startRead(addr, len(p))
	if err != nil {
		return err
	}
	defer s.endRead()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	d := s.c.d
	if err := d.check("cuCtxSetCurrent", d.cuCtxSetCurrent(s.c.ctx)); err != nil {
		return err
	}
	if err := d.check("cuMemcpyDtoHAsync(snapshot)", d.memcpyDtoHAsync(p, src, s.stream)); err != nil {
		return err
	}
	return d.check("cuStreamSynchronize(snapshot)", d.cuStreamSynchronize(s.stream))
}

// startRead finds the staging address of n bytes at addr and counts a
// read under way (endRead ends it).
func (s *memSnapshot) startRead(addr uint64, n int) (uint64, error) {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	if s.released {
		return 0, errReleased
	}
	i := sort.Search(len(s.parts), func(i int) bool { return s.parts[i].addr > addr }) - 1
	if i < 0 || addr-s.parts[i].addr+uint64(n) > s.parts[i].size {
		return 0, fmt.Errorf("%w: %d bytes at %#x are not in the snapshot", abi.StatusOutOfRange, n, addr)
	}
	s.reading++
	return s.parts[i].staging + addr - s.parts[i].addr, nil
}

func (s *memSnapshot) endRead() {
	s.c.mu.Lock()
	if s.reading--; s.reading == 0 {
		s.idle.Broadcast()
	}
	s.c.mu.Unlock()
}

// Release implements gpu.MemorySnapshot.
func (s *memSnapshot) Release() {
	s.c.do(func() error { s.releaseLocked(); return nil })
}

// releaseLocked waits until no read is under way, then frees the staging
// memory and the stream (a context already destroyed took them with it;
// the errors are then expected and ignored). It may unlock s.c.mu while it
// waits; the calling thread keeps the context current.
// Precondition: s.c.mu must be locked, the context current.
func (s *memSnapshot) releaseLocked() {
	if s.released {
		return
	}
	s.released = true
	for s.reading > 0 {
		s.idle.Wait()
	}
	if s.stream != 0 {
		s.c.d.cuStreamDestroy(s.stream)
	}
	if s.staging != 0 {
		s.c.d.cuMemFree(s.staging)
	}
	s.parts, s.staging = nil, 0
	if s.c.snap == s {
		s.c.snap = nil
	}
}
