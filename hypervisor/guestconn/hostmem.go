package guestconn

import (
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/internal/guesterr"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Host-memory copies. A guest on the shared-memory transport may hand its
// connection a host-memory region (pvdriver/transport/shm's hostmem.go):
// the memory its page-locked allocations come from. The connection takes
// the region for its life, page-locks it with a backend that can
// (gpu.HostRegistrar), and its session copies straight between the region
// and the device (abi.HostCopy: an offset and a length, checked against
// the region this node mapped, never trusted):
//   - unreplicated, a host-to-device copy is a device copy from the region,
//     with no copy through the node's memory; on a stream it may still be
//     running when the reply goes (CUDA's rule for page-locked memory: the
//     guest synchronises before it reuses the bytes), so the connection
//     waits for the session's device work before it lets the region go;
//   - replicated, the region's bytes are read exactly once, into a log
//     buffer (a replicate.Draft, as for a Ring copy): the record is an
//     ordinary OpCopyHtoD with the data, the device copy runs from that
//     buffer, so primary and standby can never differ, and the standby
//     needs no region;
//   - a device-to-host copy writes into the region (no state changes);
//     replicated, through a log buffer first: the read's read-back is
//     logged from that buffer, never from the region, where a guest
//     thread may already have rewritten the bytes (hypervisor/readback.go).
// A guest that rewrites the region while it is read garbles only its own
// copy. A connection without a region answers StatusNotSupported, and the
// guest sends the copy inline instead: after a failover onto a node that
// serves it over unix or tcp, a resent host copy the session had already
// applied is answered from its state (exactly once, by request id); one it
// had not is refused and comes back inline under a new id.
//
// What host copies cost the node is bounded as any connection's replies
// are: a host copy's reply is a few bytes (its data lies in the region,
// the guest's own pages, which the listener's host-memory budget bounds),
// so a guest that reads none of its replies meets the connection's reply
// bound like any other (replies.go); a replicated read's read-back is a
// log record like any other, within the log's bound.

// Region is a guest's host-memory region as its connection maps it.
type Region struct {
	mem []byte
	// queued: a device copy on a stream from mem may still be running.
	// Guarded by the lock of the session that issued it.
	queued bool
}

// NewRegion is a region over mem (a connection maps one; tests make one).
func NewRegion(mem []byte) *Region { return &Region{mem: mem} }

// Bytes is the region's memory.
func (h *Region) Bytes() []byte { return h.mem }

// MarkQueued notes that a device copy on a stream from the region may
// still be running; Queued reports it. Both under the lock of the session
// that issued it.
func (h *Region) MarkQueued()  { h.queued = true }
func (h *Region) Queued() bool { return h.queued }

// Span is the part of the region a host copy names, checked against the
// region this node mapped and the frame limit maxPayload (a copy moves at
// most what an inline one may, so a replicated one is one record). A nil
// region is a connection without one.
func (h *Region) Span(r *abi.HostCopy, maxPayload int) ([]byte, error) {
	if h == nil {
		return nil, guesterr.Fail(abi.StatusNotSupported, "this connection maps no host-memory region: send the copy inline")
	}
	if limit := uint64(maxPayload - 64); r.Size > limit {
		return nil, guesterr.Fail(abi.StatusInvalidValue, "host copy of %d bytes exceeds the %d-byte copy limit", r.Size, limit)
	}
	if n := uint64(len(h.mem)); r.Offset > n || r.Size > n-r.Offset {
		return nil, guesterr.Fail(abi.StatusOutOfRange, "host copy of %d bytes at offset %d is outside the %d-byte host-memory region", r.Size, r.Offset, n)
	}
	return h.mem[r.Offset : r.Offset+r.Size], nil
}

// hostMemoryConn is a transport that can hand over a guest's host-memory
// region (shm.Conn).
type hostMemoryConn interface {
	TakeHostMemory() (mem []byte, release func())
}

// takeHostMemory takes the connection's host-memory region, if it has one,
// and page-locks it. It returns what lets it go, to be called once the
// connection's session is detached: it waits for the session's device
// copies from the region, unlocks and unmaps it.
func (c *guestConn) takeHostMemory() (release func()) {
	hc, ok := c.conn.(hostMemoryConn)
	if !ok {
		return func() {}
	}
	mem, unmap := hc.TakeHostMemory()
	if mem == nil {
		return func() {}
	}
	region := NewRegion(mem)
	unlock := c.pageLock(mem, "host-memory region")
	c.host = region
	return func() {
		c.dropHostMemory(region)
		unlock()
		unmap()
	}
}

// dropHostMemory makes sure nothing uses region any more (Session.DropRegion).
func (c *guestConn) dropHostMemory(region *Region) {
	if c.sess == nil {
		return
	}
	if err := c.sess.DropRegion(region); err != nil { // the copies are over either way
		c.log.Warn("waiting for device copies from a host-memory region", "err", err)
	}
}

// pageLock page-locks mem with a backend that can (gpu.HostRegistrar), so
// device copies from it run at DMA rate, and returns what undoes that.
// Failing costs speed, not correctness: it is logged and the connection
// goes on.
func (c *guestConn) pageLock(mem []byte, what string) (unlock func()) {
	reg, can := c.e.cfg.Backend.(gpu.HostRegistrar)
	if !can {
		return func() {}
	}
	undo, err := reg.RegisterHost(mem)
	if err != nil {
		c.log.Warn("page-locking a guest's "+what, "err", err)
		return func() {}
	}
	return func() {
		if err := undo(); err != nil {
			c.log.Warn("unlocking a guest's "+what, "err", err)
		}
	}
}
