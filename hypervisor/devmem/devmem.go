// Package devmem is a session's device memory: its address window, the
// allocations in it, the ranges reserved in it and the mappings in those
// (CUDA's virtual memory management, vmm.go), the tenant they count
// against, and the requests that
// allocate, copy and fill it (the frame's bytes, a shared ring's streamed
// to the device, a host-memory region's); and, for replication, its
// contents as records and in a resync snapshot.
//
// It owns the isolation check (CheckRange): no request may name device
// memory the session did not allocate, and every address a backend sees
// is translated here (a standby whose window is not at the primary's
// base). It must never log (the session records what its requests
// change), never trust a size or address a guest sends, and never run a
// kernel (package objects does).
//
// A Memory is guarded by its session's lock.
package devmem

import (
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/vgpuha/vgpuha/handlemap"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/guestconn"
	"github.com/vgpuha/vgpuha/hypervisor/internal/guesterr"
	"github.com/vgpuha/vgpuha/hypervisor/replica"
	"github.com/vgpuha/vgpuha/hypervisor/tenancy"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
)

var fail = guesterr.Fail

// snapshotChunk bounds the data in one record of contents copied with the
// session stopped (a backend without memory snapshots); a memory
// snapshot's records are as large as the sender's buffers.
const snapshotChunk = 1 << 20

// Objects is what a session's memory asks of its objects: the stream a
// copy runs on, and room for one more object (allocations and handles
// share a quota).
type Objects interface {
	Stream(h uint64) (gpu.Stream, error)
	CheckRoom() error
}

// Config bounds a session's memory.
type Config struct {
	// MemoryQuota bounds the bytes allocated; every allocation is aligned
	// to AllocAlign; a copy moves at most what a frame of MaxPayload holds.
	MemoryQuota, AllocAlign uint64
	MaxPayload              int
	// InPlaceBytes counts copy bytes taken where they lay, by where they
	// went (vgpuha_guest_inplace_copy_bytes_total).
	InPlaceBytes func(to string, n int)
}

// Memory is one session's device memory.
type Memory struct {
	ctx    gpu.Context
	cfg    Config
	objs   Objects
	tenant *tenancy.Tenant // nil for a replica of a session opened by an older primary
	base   uint64          // window base the guest sees; the allocator works in these addresses
	size   uint64
	// delta is added to a guest address to get the backend's address: zero
	// when the backend placed the window where asked (identical addresses),
	// non-zero on a standby whose backend refused the base (translated).
	delta uint64
	// ranges are the allocations and mappings (vmm.go), which hold device
	// memory; mapped marks the mappings among them. reserved are the
	// reservations (vmm.go), and space the window's taken ranges: the
	// allocations and the reservations, where nothing else may be placed.
	ranges   handlemap.Ranges
	mapped   map[uint64]bool
	reserved handlemap.Ranges
	space    handlemap.Ranges
	// placed, when non-zero, is the address the next alloc must use (a
	// resync rebuilding an allocation where the primary had it).
	placed uint64
	// queue: a host-to-device copy may stay queued on the device (a
	// replayed record's body, kept until settled: replica.Applier's
	// QueueCopies).
	queue bool
	// inPlace is the data of the copy being run when it goes from the
	// guest's shared memory straight to the device (StreamFrom).
	inPlace *abi.InPlace
	// host is the host-memory region of the connection serving the
	// session, if it has one.
	host *guestconn.Region
	// spare is the buffer of the session's last read, back from its
	// reply (replybuf.go).
	spare atomic.Pointer[[]byte]
}

// New returns the memory of a session on ctx whose guest sees the window
// [base, base+size), which the backend placed at base+delta.
func New(ctx gpu.Context, cfg Config, base, size, delta uint64) *Memory {
	return &Memory{ctx: ctx, cfg: cfg, base: base, size: size, delta: delta}
}

// Attach gives the memory its session's objects and tenant.
func (m *Memory) Attach(objs Objects, t *tenancy.Tenant) { m.objs, m.tenant = objs, t }

// Base and Size are the guest's window.
func (m *Memory) Base() uint64 { return m.base }
func (m *Memory) Size() uint64 { return m.size }

// Ranges lists the allocations, by address; Bytes sums them.
func (m *Memory) Ranges() []handlemap.Range { return m.ranges.All() }
func (m *Memory) Bytes() uint64             { return m.ranges.Total() }

// Allocation returns the allocation that starts at ptr.
func (m *Memory) Allocation(ptr uint64) (handlemap.Range, bool) {
	r, ok := m.ranges.Find(ptr, 0)
	return r, ok && r.Addr == ptr
}

// Free frees the allocation at ptr (Allocation found it).
func (m *Memory) Free(ptr uint64) error {
	if err := m.ctx.Free(m.dev(ptr)); err != nil {
		return err
	}
	if r, ok := m.ranges.Remove(ptr); ok {
		m.tenant.Release(r.Size)
	}
	m.space.Remove(ptr)
	return nil
}

// Host is the region of the connection serving the session (nil: none);
// SetHost gives it one.
func (m *Memory) Host() *guestconn.Region     { return m.host }
func (m *Memory) SetHost(h *guestconn.Region) { m.host = h }

// StreamFrom makes the next CopyHtoD take its data from the shared ring
// where it lies (nil: from the request).
func (m *Memory) StreamFrom(data *abi.InPlace) { m.inPlace = data }

// Contains implements objects.Memory.
func (m *Memory) Contains(addr, n uint64) bool { return m.spans(addr, n) }

// Delta implements objects.Memory.
func (m *Memory) Delta() uint64 { return m.delta }

// Allocations implements objects.Memory: allocations, mappings and
// reservations, each an object of the session's quota.
func (m *Memory) Allocations() int { return m.ranges.Len() + m.reserved.Len() }

// Write implements aperture.Device: a copy to the device on the null
// stream (the caller checked the range).
func (m *Memory) Write(addr uint64, data []byte) error { return m.ctx.CopyHtoD(m.dev(addr), data, 0) }

// Read implements aperture.Device.
func (m *Memory) Read(buf []byte, addr uint64) error { return m.ctx.CopyDtoH(buf, m.dev(addr), 0) }

// Place implements replica.Memory.
func (m *Memory) Place(addr uint64) { m.placed = addr }

// Prefault implements replica.Memory (gpu.Prefaulter).
func (m *Memory) Prefault(addr, n uint64) {
	if p, ok := m.ctx.(gpu.Prefaulter); ok {
		p.Prefault(m.dev(addr), n)
	}
}

// Translated implements replica.Memory.
func (m *Memory) Translated() bool { return m.delta != 0 }

// Replaying implements replica.Memory; a replay's end also ends its
// placement.
func (m *Memory) Replaying(on, queue bool) {
	m.queue = on && queue
	if !on {
		m.placed = 0
	}
}

// Queued implements replica.Memory.
func (m *Memory) Queued() (gpu.QueuedCopier, bool) {
	q, ok := m.ctx.(gpu.QueuedCopier)
	return q, ok
}

// Release frees the session's memory from its tenant's count (the
// session is closed; its context frees the device memory).
func (m *Memory) Release() {
	m.tenant.Release(m.ranges.Total())
	m.ranges, m.space, m.reserved, m.mapped = handlemap.Ranges{}, handlemap.Ranges{}, handlemap.Ranges{}, nil
}

// dev translates a guest device address to the backend's.
func (m *Memory) dev(addr uint64) uint64 { return addr + m.delta }

// CheckRange reports whether [addr, addr+n) lies inside one of this
// session's allocations, or in mappings that follow one another. It is
// the isolation check: no request may name device memory the session did
// not allocate.
func (m *Memory) CheckRange(addr, n uint64, what string) error {
	if !m.spans(addr, n) {
		return fail(abi.StatusOutOfRange, "%s: %d bytes at %#x are not inside one of this session's allocations", what, n, addr)
	}
	return nil
}

// Checksum computes gpu.Checksum of device memory, on the device where the
// backend can.
func (m *Memory) Checksum(addr, n uint64) (uint64, error) {
	if c, ok := m.ctx.(gpu.Checksummer); ok {
		return c.Checksum(m.dev(addr), n)
	}
	buf := make([]byte, n)
	if err := m.ctx.CopyDtoH(buf, m.dev(addr), 0); err != nil {
		return 0, err
	}
	return gpu.Checksum(buf), nil
}

// Alloc allocates in the window (at the placed address on a resync),
// within the session's and its tenant's quotas.
func (m *Memory) Alloc(r *abi.Alloc) (abi.Body, error) {
	if r.Size == 0 {
		return nil, fail(abi.StatusInvalidValue, "alloc of zero bytes")
	}
	if r.Size > m.cfg.MemoryQuota-m.ranges.Total() {
		return nil, fail(abi.StatusOutOfMemory, "alloc of %d bytes exceeds the session quota (%d of %d bytes in use; --guest.memory-quota-bytes)",
			r.Size, m.ranges.Total(), m.cfg.MemoryQuota)
	}
	if err := m.objs.CheckRoom(); err != nil {
		return nil, err
	}
	addr, ok := m.space.FirstFit(m.base, m.size, r.Size, m.cfg.AllocAlign)
	if m.placed != 0 {
		addr, m.placed = m.placed, 0
		ok = m.inWindow(addr, r.Size)
	}
	if !ok || m.space.Insert(addr, r.Size) != nil {
		return nil, fail(abi.StatusOutOfMemory, "no room for %d bytes in the session's %d-byte address window", r.Size, m.size)
	}
	if err := m.tenant.Reserve(r.Size); err != nil {
		m.space.Remove(addr)
		return nil, err
	}
	if err := m.ctx.Alloc(m.dev(addr), r.Size); err != nil {
		m.space.Remove(addr)
		m.tenant.Release(r.Size)
		return nil, err
	}
	if err := m.ranges.Insert(addr, r.Size); err != nil {
		return nil, fmt.Errorf("recording allocation: %w", err) // cannot happen: space had room
	}
	return &abi.AllocReply{Ptr: addr}, nil
}

// CopyHtoD copies to the device from the request, or from the shared
// ring where the data lies (StreamFrom); a replayed record's copy may
// stay queued.
func (m *Memory) CopyHtoD(r *abi.CopyHtoD) (abi.Body, error) {
	st, err := m.objs.Stream(r.Stream)
	if err != nil {
		return nil, err
	}
	n := uint64(len(r.Data))
	if m.inPlace != nil {
		n = uint64(m.inPlace.Len())
	}
	if err := m.CheckRange(r.Dst, n, "copy to device"); err != nil {
		return nil, err
	}
	if m.inPlace != nil {
		return nil, m.copyInPlace(m.dev(r.Dst), st)
	}
	if q, ok := m.ctx.(gpu.QueuedCopier); ok && m.queue {
		return nil, q.QueueCopyHtoD(m.dev(r.Dst), r.Data, st) // the record's body stays put until it is settled (Server.Mark, Settle)
	}
	return nil, m.ctx.CopyHtoD(m.dev(r.Dst), r.Data, st)
}

// CopyDtoH copies from the device into a reply (at most a frame).
func (m *Memory) CopyDtoH(r *abi.CopyDtoH) (abi.Body, error) {
	st, err := m.objs.Stream(r.Stream)
	if err != nil {
		return nil, err
	}
	if limit := uint64(m.cfg.MaxPayload - 64); r.Size > limit {
		return nil, fail(abi.StatusInvalidValue, "copy from device of %d bytes exceeds the %d-byte reply limit", r.Size, limit)
	}
	if err := m.CheckRange(r.Src, r.Size, "copy from device"); err != nil {
		return nil, err
	}
	buf := m.readBuffer(int(r.Size))
	if err := m.ctx.CopyDtoH(buf, m.dev(r.Src), st); err != nil {
		m.keepSpare(buf)
		return nil, err
	}
	return &abi.DataReply{Data: buf, Release: func() { m.keepSpare(buf) }}, nil
}

// CopyDtoD copies between two of the session's allocations.
func (m *Memory) CopyDtoD(r *abi.CopyDtoD) (abi.Body, error) {
	st, err := m.objs.Stream(r.Stream)
	if err != nil {
		return nil, err
	}
	if err := m.CheckRange(r.Src, r.Size, "device copy source"); err != nil {
		return nil, err
	}
	if err := m.CheckRange(r.Dst, r.Size, "device copy destination"); err != nil {
		return nil, err
	}
	return nil, m.ctx.CopyDtoD(m.dev(r.Dst), m.dev(r.Src), r.Size, st)
}

// Memset fills count elements of width bytes.
func (m *Memory) Memset(r *abi.Memset) (abi.Body, error) {
	st, err := m.objs.Stream(r.Stream)
	if err != nil {
		return nil, err
	}
	if r.Width != 1 && r.Width != 2 && r.Width != 4 {
		return nil, fail(abi.StatusInvalidValue, "memset width %d (want 1, 2 or 4)", r.Width)
	}
	if r.Width < 4 && r.Value>>(8*r.Width) != 0 {
		return nil, fail(abi.StatusInvalidValue, "%d-bit memset of value %#x", 8*r.Width, r.Value)
	}
	if r.Count > m.size/uint64(r.Width) {
		return nil, fail(abi.StatusOutOfRange, "memset of %d elements is larger than the address window", r.Count)
	}
	if err := m.CheckRange(r.Dst, r.Count*uint64(r.Width), "memset"); err != nil {
		return nil, err
	}
	return nil, m.ctx.Memset(m.dev(r.Dst), int(r.Width), r.Value, r.Count, st)
}

// ContentRecords reads an allocation and returns copy records, at most
// snapshotChunk bytes each, that write its contents on the standby.
func (m *Memory) ContentRecords(session uint64, r handlemap.Range, flags uint16) ([]replicate.Record, error) {
	var recs []replicate.Record
	for off := uint64(0); off < r.Size; off += snapshotChunk {
		buf := make([]byte, min(r.Size-off, snapshotChunk))
		if err := m.ctx.CopyDtoH(buf, m.dev(r.Addr+off), 0); err != nil {
			return recs, err
		}
		body := (&abi.CopyHtoD{Dst: r.Addr + off, Data: buf}).Append(nil)
		recs = append(recs, replicate.Record{Session: session, Op: replicate.Op(abi.OpCopyHtoD), Flags: flags, Body: body})
	}
	return recs, nil
}

// HostSpan is the part of the connection's region a host copy names
// (guestconn.Region.Span).
func (m *Memory) HostSpan(r *abi.HostCopy) ([]byte, error) { return m.host.Span(r, m.cfg.MaxPayload) }

// CopyHtoDHost copies from the region to the device (unreplicated: a
// replicated session's host copies become log records first, takeHostCopy).
func (m *Memory) CopyHtoDHost(r *abi.HostCopy) (abi.Body, error) {
	st, err := m.objs.Stream(r.Stream)
	if err != nil {
		return nil, err
	}
	src, err := m.HostSpan(r)
	if err != nil {
		return nil, err
	}
	if err := m.CheckRange(r.Dev, r.Size, "copy to device"); err != nil {
		return nil, err
	}
	if st != 0 {
		m.host.MarkQueued()
	}
	m.cfg.InPlaceBytes("hostmem_device", len(src))
	return nil, m.ctx.CopyHtoD(m.dev(r.Dev), src, st)
}

// CopyDtoHHost copies from the device into the region; it is complete
// when the backend returns.
func (m *Memory) CopyDtoHHost(r *abi.HostCopy) (abi.Body, error) {
	st, dst, err := m.checkDtoHHost(r)
	if err != nil {
		return nil, err
	}
	return nil, m.ctx.CopyDtoH(dst, m.dev(r.Dev), st)
}

// CopyDtoHHostThrough is CopyDtoHHost through private memory: once the
// request is checked, the device copies into private(n), n being the
// copy's size (at most a frame), and that is copied into the region. The
// private bytes are then what the device returned, whatever a guest
// thread writes into its region meanwhile (a replicated session logs
// them as the read's read-back). private is not called for a refused
// request.
func (m *Memory) CopyDtoHHostThrough(r *abi.HostCopy, private func(n int) []byte) (abi.Body, error) {
	st, dst, err := m.checkDtoHHost(r)
	if err != nil {
		return nil, err
	}
	buf := private(len(dst))
	if err := m.ctx.CopyDtoH(buf, m.dev(r.Dev), st); err != nil {
		return nil, err
	}
	copy(dst, buf)
	return nil, nil
}

// checkDtoHHost checks a copy from the device into the region and returns
// its stream and the region's bytes it writes.
func (m *Memory) checkDtoHHost(r *abi.HostCopy) (gpu.Stream, []byte, error) {
	st, err := m.objs.Stream(r.Stream)
	if err != nil {
		return 0, nil, err
	}
	dst, err := m.HostSpan(r)
	if err != nil {
		return 0, nil, err
	}
	if err := m.CheckRange(r.Dev, r.Size, "copy from device"); err != nil {
		return 0, nil, err
	}
	return st, dst, nil
}

// Snapshot adds the session's device memory to a resync snapshot: a
// backend's point-in-time copy, or, failing that, records copied now.
func (m *Memory) Snapshot(session uint64, snap *replica.Snapshot, log *slog.Logger) error {
	all := m.ranges.All()
	if len(all) == 0 {
		return nil
	}
	ranges := make([]gpu.Range, len(all))
	parts := make([]replica.Part, len(all))
	for i, r := range all {
		ranges[i] = gpu.Range{Addr: m.dev(r.Addr), Size: r.Size}
		parts[i] = replica.Part{Addr: r.Addr, Dev: m.dev(r.Addr), Size: r.Size}
	}
	if sn, ok := m.ctx.(gpu.Snapshotter); ok {
		mem, err := sn.SnapshotMemory(ranges)
		if err == nil {
			snap.AddMemory(session, mem, parts)
			return nil
		}
		log.Warn("no point-in-time memory snapshot; copying this session's memory with it stopped", "session", session, "err", err)
	}
	for _, r := range all {
		recs, err := m.ContentRecords(session, r, replicate.FlagPlaced)
		if err != nil {
			return fmt.Errorf("session %d: reading allocation %#x for a snapshot: %w", session, r.Addr, err)
		}
		snap.AddRecords(recs, r.Size)
	}
	return nil
}

// copyInPlace copies the in-place data of the copy being run from shared
// memory to device address dst, span by span (the range was checked).
func (m *Memory) copyInPlace(dst uint64, st gpu.Stream) error {
	return m.inPlace.Stream(func(off int, span []byte) error {
		return m.ctx.CopyHtoD(dst+uint64(off), span, st)
	})
}
