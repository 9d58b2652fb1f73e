package sim

import (
	"errors"
	"fmt"
	"sort"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// The software GPU's memory snapshot is copy-on-write in software. Every
// write to device memory goes through the context (copies, memsets, and
// the Go kernels, which reach memory only through writable views), so
// taking a snapshot is O(ranges): it marks the allocations. Before the
// first write to a page that the snapshot has not yet handed out, the
// page's old bytes are kept; a read takes the kept bytes, or the live
// ones when the page was never written. A page read out whole is let go:
// later writes to it keep nothing. So the extra memory is at most the
// pages written after the snapshot and before they were read. A freed (or
// closed) allocation's memory passes to the snapshot as it is.

// cowPage is the copy-on-write granularity.
const cowPage = 64 << 10

// errReleased: the snapshot was released (or replaced by a newer one).
var errReleased = errors.New("sim: memory snapshot released")

// memSnapshot implements gpu.MemorySnapshot.
type memSnapshot struct {
	c        *guestContext
	allocs   []*cowAlloc // sorted by addr
	released bool        // guarded by c.mu
}

// cowAlloc is one allocation as a snapshot sees it. Guarded by the
// context's mu.
type cowAlloc struct {
	addr uint64
	live []byte         // the allocation's memory; no longer written once freed
	kept map[int][]byte // page -> bytes at the snapshot, kept before a write
	done []bool         // page was read out: nothing to keep any more
}

// SnapshotMemory implements gpu.Snapshotter.
func (c *guestContext) SnapshotMemory(ranges []gpu.Range) (gpu.MemorySnapshot, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.snap != nil {
		c.snap.releaseLocked()
	}
	s := &memSnapshot{c: c}
	seen := map[int]bool{}
	for _, r := range ranges {
		i, _, err := c.span(r.Addr, r.Size)
		if err != nil {
			s.releaseLocked()
			return nil, err
		}
		if seen[i] {
			continue
		}
		seen[i] = true
		a := &c.allocs[i]
		pages := (len(a.data) + cowPage - 1) / cowPage
		ca := &cowAlloc{addr: a.addr, live: a.data, kept: map[int][]byte{}, done: make([]bool, pages)}
		a.cow = ca
		s.allocs = append(s.allocs, ca)
	}
	sort.Slice(s.allocs, func(i, j int) bool { return s.allocs[i].addr < s.allocs[j].addr })
	c.snap = s
	return s, nil
}

// keep saves the pages of [off, off+n) the snapshot still needs, before
// they are written.
// Precondition: the context's mu must be locked.
func (ca *cowAlloc) keep(off, n uint64) {
	if n == 0 {
		return
	}
	for p := int(off / cowPage); p <= int((off+n-1)/cowPage); p++ {
		if ca.done[p] || ca.kept[p] != nil {
			continue
		}
		lo, hi := p*cowPage, min((p+1)*cowPage, len(ca.live))
		ca.kept[p] = append([]byte(nil), ca.live[lo:hi]...)
	}
}

// ReadAt implements gpu.MemorySnapshot.
func (s *memSnapshot) ReadAt(p []byte, addr uint64) error {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	if s.released {
		return errReleased
	}
	i := sort.Search(len(s.allocs), func(i int) bool { return s.allocs[i].addr > addr }) - 1
	if i < 0 || addr-s.allocs[i].addr+uint64(len(p)) > uint64(len(s.allocs[i].live)) {
		return fmt.Errorf("%w: %d bytes at %#x are not in the snapshot", abi.StatusOutOfRange, len(p), addr)
	}
	ca := s.allocs[i]
	off := int(addr - ca.addr)
	end := off + len(p)
	for pos := off; pos < end; {
		pg := pos / cowPage
		pageEnd := min((pg+1)*cowPage, len(ca.live))
		n := min(pageEnd, end) - pos
		if kept := ca.kept[pg]; kept != nil {
			copy(p[pos-off:], kept[pos-pg*cowPage:][:n])
		} else {
			copy(p[pos-off:], ca.live[pos:pos+n])
		}
		if pos == pg*cowPage && pos+n == pageEnd { // the whole page was read: let it go
			ca.done[pg] = true
			delete(ca.kept, pg)
		}
		pos += n
	}
	return nil
}

// Release implements gpu.MemorySnapshot.
func (s *memSnapshot) Release() {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	s.releaseLocked()
}

// Precondition: s.c.mu must be locked.
func (s *memSnapshot) releaseLocked() {
	if s.released {
		return
	}
	s.released = true
	mine := make(map[*cowAlloc]bool, len(s.allocs))
	for _, ca := range s.allocs {
		mine[ca] = true
		ca.live, ca.kept = nil, nil
	}
	for i := range s.c.allocs {
		if mine[s.c.allocs[i].cow] {
			s.c.allocs[i].cow = nil
		}
	}
	if s.c.snap == s {
		s.c.snap = nil
	}
}
