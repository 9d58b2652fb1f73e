package pvdriver

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/pvdriver/transport/shm"
)

// Host memory (page-locked memory, as cuMemAllocHost gives). A client that
// opens a session on a shared-memory endpoint makes a host-memory region
// (the endpoint's hostmem parameter; transport.NewHostMemory) and hands it
// to every shared-memory connection it makes; AllocHost carves buffers out
// of it. A copy whose host side lies in the region, on a connection whose
// node mapped it, moves no data through the rings: it names the bytes
// (abi.HostCopy) and the node's GPU copies them straight from or into
// the region at DMA rate. Everywhere else (no region, a node that refused
// it, a resume on a node reached over unix, tcp or vsock) the same calls
// send the data inline, as for any memory.
//
// A host copy is a synchronous call whose reply is a commit point (abi's
// hostmem.go): the region's bytes may be reused once the reply is in (a
// null-stream copy) or once its stream is synchronised (a copy on a
// stream, which the device may still be running: CUDA's rule for
// page-locked memory), and a resend after a failover never reads bytes
// rewritten since. A node without the region refuses the call
// (StatusNotSupported) and the client sends it inline instead, under a new
// request id: the refused call changed nothing.

// ErrNoHostMemory reports that AllocHost cannot serve a request from the
// host-memory region (none, or no room): the caller may use ordinary
// memory instead, whose copies travel inline.
var ErrNoHostMemory = errors.New("pvdriver: no room in the host-memory region")

// hostPage is the region's allocation unit.
const hostPage = 4096

// hostArena is the client's host-memory region and its allocator: a
// first-fit list of free spans, sorted by offset and coalesced.
type hostArena struct {
	region *shm.HostMemory
	mu     sync.Mutex
	free   []hostSpan
	used   map[uint64]uint64 // offset -> size of each allocation
}

type hostSpan struct{ off, size uint64 }

func newHostArena(region *shm.HostMemory) *hostArena {
	if region == nil {
		return nil
	}
	return &hostArena{region: region, free: []hostSpan{{0, uint64(len(region.Bytes()))}}, used: map[uint64]uint64{}}
}

// memory is the region to hand a new connection (nil for none).
func (a *hostArena) memory() *shm.HostMemory {
	if a == nil {
		return nil
	}
	return a.region
}

// alloc returns the offset of n free bytes (rounded up to whole pages).
func (a *hostArena) alloc(n uint64) (uint64, bool) {
	if n == 0 || n > 1<<62 {
		return 0, false
	}
	n = (n + hostPage - 1) / hostPage * hostPage
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, s := range a.free {
		if s.size < n {
			continue
		}
		if s.size == n {
			a.free = slices.Delete(a.free, i, i+1)
		} else {
			a.free[i] = hostSpan{s.off + n, s.size - n}
		}
		a.used[s.off] = n
		return s.off, true
	}
	return 0, false
}

// release frees the allocation at off; false if there is none.
func (a *hostArena) release(off uint64) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	n, ok := a.used[off]
	if !ok {
		return false
	}
	delete(a.used, off)
	i, _ := slices.BinarySearchFunc(a.free, off, func(s hostSpan, off uint64) int {
		return cmpU64(s.off, off)
	})
	a.free = slices.Insert(a.free, i, hostSpan{off, n})
	if i+1 < len(a.free) && a.free[i].off+a.free[i].size == a.free[i+1].off {
		a.free[i].size += a.free[i+1].size
		a.free = slices.Delete(a.free, i+1, i+2)
	}
	if i > 0 && a.free[i-1].off+a.free[i-1].size == a.free[i].off {
		a.free[i-1].size += a.free[i].size
		a.free = slices.Delete(a.free, i, i+1)
	}
	return true
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// close unmaps the region.
func (a *hostArena) close() {
	if a != nil {
		a.region.Close()
	}
}

// AllocHost returns n bytes of the session's host-memory region, page
// aligned, valid until FreeHost or Close. Copies to and from them run at
// the GPU's DMA rate on a node that maps the region. ErrNoHostMemory: the
// client has no region (not a shared-memory endpoint, or hostmem=0) or no
// room left in it.
func (c *Client) AllocHost(n int) ([]byte, error) {
	if c.host == nil || n <= 0 {
		return nil, ErrNoHostMemory
	}
	off, ok := c.host.alloc(uint64(n))
	if !ok {
		return nil, fmt.Errorf("%w: %d bytes wanted", ErrNoHostMemory, n)
	}
	mem := c.host.region.Bytes()
	if mem == nil { // the client was closed
		c.host.release(off)
		return nil, c.closedErr()
	}
	return mem[off : off+uint64(n) : off+uint64(n)], nil
}

// FreeHost gives back a buffer AllocHost returned.
func (c *Client) FreeHost(b []byte) error {
	if c.host != nil {
		if off, ok := offsetIn(c.host.region.Bytes(), b); ok && c.host.release(off) {
			return nil
		}
	}
	return fmt.Errorf("%w: not a buffer AllocHost returned", ErrInvalidValue)
}

// IsHostMemory reports whether b lies in the host-memory region.
func (c *Client) IsHostMemory(b []byte) bool {
	if c.host == nil {
		return false
	}
	_, ok := offsetIn(c.host.region.Bytes(), b)
	return ok
}

// hostOffset is where b lies in the region, if it does and the current
// connection's node maps the region.
func (c *Client) hostOffset(b []byte) (uint64, bool) {
	if c.host == nil {
		return 0, false
	}
	off, ok := offsetIn(c.host.region.Bytes(), b)
	if !ok {
		return 0, false
	}
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()
	hc, shared := conn.(interface{ HostMemoryShared() bool })
	return off, shared && hc.HostMemoryShared()
}

// copyHtoDHost copies src, which lies in the region, to dst by host
// copies; done is false when src is not in a region the node maps (the
// caller sends it inline).
func (c *Client) copyHtoDHost(dst DevicePtr, src []byte, s Stream, async bool) (done bool, err error) {
	off, ok := c.hostOffset(src)
	if !ok {
		return false, nil
	}
	return true, c.hostPieces(abi.OpCopyHtoDHost, dst, off, len(src), s, func(k, n int) error {
		return c.copyHtoDFrames(dst+DevicePtr(k), src[k:k+n], s, async)
	})
}

// copyDtoHHost copies from src into dst, which lies in the region, by host
// copies; done is false when dst is not in a region the node maps.
func (c *Client) copyDtoHHost(dst []byte, src DevicePtr) (done bool, err error) {
	off, ok := c.hostOffset(dst)
	if !ok {
		return false, nil
	}
	return true, c.hostPieces(abi.OpCopyDtoHHost, src, off, len(dst), 0, func(k, n int) error {
		return c.copyDtoHFrames(dst[k:k+n], src+DevicePtr(k))
	})
}

// hostPieces runs a host copy of size bytes at region offset off and
// device address dev as pieces of one frame's size, up to hostWindow in
// flight (each is a call: the guest does not touch its buffer before the
// last reply, so a resend after a failover reads the same bytes). A piece
// the node cannot take from the region (resumed where it is not mapped)
// goes inline through inline(k, n) instead.
func (c *Client) hostPieces(op abi.Opcode, dev DevicePtr, off uint64, size int, s Stream, inline func(k, n int) error) error {
	return c.callPieces(op, size, hostWindow, func(k, n int, ch chan result) (*replyReader, bool, error) {
		return c.submit(op, &abi.HostCopy{Dev: uint64(dev) + uint64(k), Offset: off + uint64(k), Size: uint64(n), Stream: uint64(s)}, 0, ch)
	}, func(k, n int, err error) error {
		if errors.Is(err, abi.StatusNotSupported) {
			return inline(k, n)
		}
		return err
	})
}
