package shm

import (
	"sync"
	"sync/atomic"
)

// Host memory. Besides its rings a guest may hand the hypervisor a second
// sealed memory file with its hello: a host-memory region, the memory its
// page-locked allocations come from (cuMemAllocHost in the guest's
// libcuda, pvdriver.Client.AllocHost). The hypervisor maps it and
// page-locks it with the GPU, so a copy whose host side lies there moves
// only an offset and a length through the rings (abi.HostCopy) and the
// device copies straight from or into the guest's memory at DMA rate.
//
// The region is its own file, not part of the area, because it outlives a
// connection: the guest's program holds pointers into it. A guest keeps it
// mapped for its client's life and hands the same file to every connection
// it makes (a resume after a lost connection maps the same bytes at the
// same offsets); a connection without a region (plain unix, tcp, vsock, or
// a region the node refused) carries the same copies inline.
//
// The node bounds what guests make it page-lock: a listener maps regions
// of at most MaxHostMemory bytes while the regions of its open connections
// stay within its host-memory budget (DefaultHostMemoryBudget, or
// SetHostMemoryBudget); a region over it is refused, not the connection
// (the verdict says whether the region was mapped). The hypervisor takes a
// connection's region (TakeHostMemory) and releases it once no device copy
// from it can still be running; a region nobody took is unmapped by Close.

// Region sizes.
const (
	// DefaultHostMemory is the region a shared-memory guest asks for when
	// its endpoint says nothing (pvdriver/transport's hostmem parameter).
	DefaultHostMemory = 256 << 20
	// MaxHostMemory bounds one region.
	MaxHostMemory = 64 << 30
	// DefaultHostMemoryBudget bounds the regions a listener's open
	// connections hold together.
	DefaultHostMemoryBudget = 4 << 30
	// hostMemoryAlign: a region is a whole number of pages.
	hostMemoryAlign = 4096
)

// validHostMemory reports whether a region of n bytes may be asked for
// (zero: none).
func validHostMemory(n uint64) bool { return n <= MaxHostMemory && n%hostMemoryAlign == 0 }

// HostMemory is a guest's host-memory region: a sealed memory file and
// its mapping, handed to each connection dialled with it (Options). It is
// valid until Close.
type HostMemory struct {
	mu  sync.RWMutex // Close takes it exclusively: Bytes may race with it
	fd  int
	mem []byte
}

// Bytes is the region (nil once closed). Copies to and from it may run on
// the device while a call that started them is outstanding (like CUDA's
// page-locked memory).
func (h *HostMemory) Bytes() []byte {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.mem
}

// hostRegion is a connection's side of a host-memory region.
//   - On the guest: shared says the hypervisor mapped the region.
//   - On the hypervisor: mem is the mapping until it is released, once;
//     taken says the hypervisor took it (TakeHostMemory) and releases it
//     itself, else Close does.
type hostRegion struct {
	shared  bool
	mem     []byte
	taken   bool
	release func() // unmaps mem and gives its bytes back to the budget; runs once
}

// TakeHostMemory hands the hypervisor the guest's host-memory region (nil
// if it has none, or the connection is closed) and the function that
// releases it, which the caller must call once nothing can use the memory
// any more: after it, the region is unmapped. Close leaves a taken region
// mapped. Its bytes are the guest's: it may rewrite them at any moment.
func (c *Conn) TakeHostMemory() (mem []byte, release func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := &c.host
	if c.area == nil || h.mem == nil || h.taken {
		return nil, func() {}
	}
	h.taken = true
	return h.mem, h.release
}

// HostMemoryShared reports whether the hypervisor mapped the region this
// (guest) side handed over with its hello.
func (c *Conn) HostMemoryShared() bool { return c.host.shared }

// dropUntaken releases the region if the hypervisor never took it.
// Precondition: c.mu must be held exclusively (Close).
func (h *hostRegion) dropUntaken() {
	if h.mem != nil && !h.taken {
		h.release()
	}
}

// hostBudget is what a listener's connections' regions may hold together.
type hostBudget struct {
	limit atomic.Int64
	used  atomic.Int64
}

// take reserves n bytes; false if they would exceed the budget.
func (b *hostBudget) take(n int64) bool {
	if b.used.Add(n) > b.limit.Load() {
		b.used.Add(-n)
		return false
	}
	return true
}

func (b *hostBudget) give(n int64) { b.used.Add(-n) }
