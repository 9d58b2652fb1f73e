package hypervisor

import (
	"fmt"

	"github.com/vgpuha/vgpuha/handlemap"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/guestconn"
	"github.com/vgpuha/vgpuha/hypervisor/objects"
	"github.com/vgpuha/vgpuha/hypervisor/tenancy"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
)

// memory is a session's device memory: its address window, the
// allocations in it, the tenant they count against, and the requests that
// allocate, copy and fill it. It owns the isolation check (CheckRange): no
// request may name device memory the session did not allocate. It never
// logs: the session records what its requests change.
//
// Guarded by its session's mu.
type memory struct {
	ctx     gpu.Context
	cfg     *Config
	objs    *objects.Set // streams a copy runs on, and the objects quota
	metrics *metrics
	tenant  *tenancy.Tenant // nil for a replica of a session opened by an older primary
	base    uint64          // window base the guest sees; the allocator works in these addresses
	size    uint64
	// delta is added to a guest address to get the backend's address: zero
	// when the backend placed the window where asked (identical addresses),
	// non-zero on a standby whose backend refused the base (translated).
	delta  uint64
	ranges handlemap.Ranges
	// placed, when non-zero, is the address the next alloc must use (a
	// resync rebuilding an allocation where the primary had it).
	placed uint64
	// queue: a host-to-device copy may stay queued on the device (a
	// replayed record's body, kept until settled: replica.Applier's
	// QueueCopies).
	queue bool
	// inPlace is the data of the copy being run when it goes from the
	// guest's shared memory straight to the device (inplace.go).
	inPlace *abi.InPlace
	// host is the host-memory region of the connection serving the
	// session, if it has one (guestconn.Host).
	host *guestconn.Region
}

// Contains implements objects.Memory.
func (m *memory) Contains(addr, n uint64) bool {
	_, ok := m.ranges.Find(addr, n)
	return ok
}

// Delta implements objects.Memory.
func (m *memory) Delta() uint64 { return m.delta }

// Allocations implements objects.Memory.
func (m *memory) Allocations() int { return m.ranges.Len() }

// Write implements aperture.Device: a copy to the device on the null
// stream (the caller checked the range).
func (m *memory) Write(addr uint64, data []byte) error { return m.ctx.CopyHtoD(m.dev(addr), data, 0) }

// Read implements aperture.Device.
func (m *memory) Read(buf []byte, addr uint64) error { return m.ctx.CopyDtoH(buf, m.dev(addr), 0) }

// Place implements replica.Memory.
func (m *memory) Place(addr uint64) { m.placed = addr }

// Prefault implements replica.Memory (gpu.Prefaulter).
func (m *memory) Prefault(addr, n uint64) {
	if p, ok := m.ctx.(gpu.Prefaulter); ok {
		p.Prefault(m.dev(addr), n)
	}
}

// Translated implements replica.Memory.
func (m *memory) Translated() bool { return m.delta != 0 }

// Replaying implements replica.Memory; a replay's end also ends its
// placement.
func (m *memory) Replaying(on, queue bool) {
	m.queue = on && queue
	if !on {
		m.placed = 0
	}
}

// Queued implements replica.Memory.
func (m *memory) Queued() (gpu.QueuedCopier, bool) {
	q, ok := m.ctx.(gpu.QueuedCopier)
	return q, ok
}

// release frees the session's memory from its tenant's count (the
// session is closed; its context frees the device memory).
func (m *memory) release() {
	m.tenant.Release(m.ranges.Total())
	m.ranges = handlemap.Ranges{}
}

// dev translates a guest device address to the backend's.
func (m *memory) dev(addr uint64) uint64 { return addr + m.delta }

// CheckRange reports whether [addr, addr+n) lies inside one of this
// session's allocations. It is the isolation check: no request may name
// device memory the session did not allocate.
func (m *memory) CheckRange(addr, n uint64, what string) error {
	if _, ok := m.ranges.Find(addr, n); !ok {
		return fail(abi.StatusOutOfRange, "%s: %d bytes at %#x are not inside one of this session's allocations", what, n, addr)
	}
	return nil
}

// Checksum computes gpu.Checksum of device memory, on the device where the
// backend can.
func (m *memory) Checksum(addr, n uint64) (uint64, error) {
	if c, ok := m.ctx.(gpu.Checksummer); ok {
		return c.Checksum(m.dev(addr), n)
	}
	buf := make([]byte, n)
	if err := m.ctx.CopyDtoH(buf, m.dev(addr), 0); err != nil {
		return 0, err
	}
	return gpu.Checksum(buf), nil
}

func (m *memory) alloc(r *abi.Alloc) (abi.Body, error) {
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
	addr, ok := m.ranges.FirstFit(m.base, m.size, r.Size, m.cfg.AllocAlign)
	if m.placed != 0 {
		addr, m.placed = m.placed, 0
		ok = addr >= m.base && r.Size <= m.size && addr-m.base <= m.size-r.Size
	}
	if !ok {
		return nil, fail(abi.StatusOutOfMemory, "no room for %d bytes in the session's %d-byte address window", r.Size, m.size)
	}
	if err := m.tenant.Reserve(r.Size); err != nil {
		return nil, err
	}
	if err := m.ctx.Alloc(m.dev(addr), r.Size); err != nil {
		m.tenant.Release(r.Size)
		return nil, err
	}
	if err := m.ranges.Insert(addr, r.Size); err != nil {
		return nil, fmt.Errorf("recording allocation: %w", err) // cannot happen: FirstFit chose a free range
	}
	return &abi.AllocReply{Ptr: addr}, nil
}

func (m *memory) copyHtoD(r *abi.CopyHtoD) (abi.Body, error) {
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

func (m *memory) copyDtoH(r *abi.CopyDtoH) (abi.Body, error) {
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
	buf := make([]byte, r.Size)
	if err := m.ctx.CopyDtoH(buf, m.dev(r.Src), st); err != nil {
		return nil, err
	}
	return &abi.DataReply{Data: buf}, nil
}

func (m *memory) copyDtoD(r *abi.CopyDtoD) (abi.Body, error) {
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

func (m *memory) memset(r *abi.Memset) (abi.Body, error) {
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

// contentRecords reads an allocation and returns copy records, at most
// snapshotChunk bytes each, that write its contents on the standby.
func (m *memory) contentRecords(session uint64, r handlemap.Range, flags uint16) ([]replicate.Record, error) {
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

// hostSpan is the part of the connection's region a host copy names
// (guestconn.Region.Span).
func (m *memory) hostSpan(r *abi.HostCopy) ([]byte, error) { return m.host.Span(r, m.cfg.MaxPayload) }

// copyHtoDHost copies from the region to the device (unreplicated: a
// replicated session's host copies become log records first, takeHostCopy).
func (m *memory) copyHtoDHost(r *abi.HostCopy) (abi.Body, error) {
	st, err := m.objs.Stream(r.Stream)
	if err != nil {
		return nil, err
	}
	src, err := m.hostSpan(r)
	if err != nil {
		return nil, err
	}
	if err := m.CheckRange(r.Dev, r.Size, "copy to device"); err != nil {
		return nil, err
	}
	if st != 0 {
		m.host.MarkQueued()
	}
	m.metrics.inPlace.WithLabelValues("hostmem_device").Add(float64(len(src)))
	return nil, m.ctx.CopyHtoD(m.dev(r.Dev), src, st)
}

// copyDtoHHost copies from the device into the region; it is complete
// when the backend returns.
func (m *memory) copyDtoHHost(r *abi.HostCopy) (abi.Body, error) {
	st, err := m.objs.Stream(r.Stream)
	if err != nil {
		return nil, err
	}
	dst, err := m.hostSpan(r)
	if err != nil {
		return nil, err
	}
	if err := m.CheckRange(r.Dev, r.Size, "copy from device"); err != nil {
		return nil, err
	}
	return nil, m.ctx.CopyDtoH(dst, m.dev(r.Dev), st)
}
