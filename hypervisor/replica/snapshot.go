package replica

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
)

// A resync snapshot stops guests only for a moment. With every session
// stopped the primary fixes the log position S (Log.BeginSnapshot),
// builds the records that recreate each session's objects (sessions,
// allocations, modules, functions, streams, handle counters: O(objects),
// no device memory), and asks the backend for a point-in-time copy of the
// sessions' device memory (gpu.Snapshotter: copy-on-write on the software
// GPU, a device-to-device copy on CUDA). Guests then run again, and the
// sender pulls the contents out of that copy, read straight into the
// buffer it seals and sends (the bytes are copied once on the primary),
// while the log keeps every change after S. The standby applies the state
// at S, then the log after S: whatever a guest wrote meanwhile (a copy, a
// memset, a device-to-device copy, an aperture flush, or a kernel writing
// through pointers it found in memory), the replica ends up identical,
// because the snapshot never sees a write after S and the log has them
// all. A session whose backend cannot take such a copy is copied the old
// way, with it stopped, into records held until sent.

// Snapshot is a resync snapshot (replicate.Snapshot) as the primary builds
// it with its sessions stopped (NewSnapshot, then Add*) and the sender
// reads it.
type Snapshot struct {
	at    uint64
	pause time.Duration
	meta  []replicate.Record // objects (and copied-the-old-way contents), sent first
	parts []contentPart      // device memory still to read
	mems  []gpu.MemorySnapshot
	total uint64
	done  uint64
	ended bool
}

// Part is one allocation whose contents a memory snapshot holds: its
// guest address, its device address and its size.
type Part struct{ Addr, Dev, Size uint64 }

// contentPart is one allocation's contents to read from a memory snapshot.
type contentPart struct {
	session uint64
	mem     gpu.MemorySnapshot
	Part
	off uint64 // bytes already read
}

// NewSnapshot starts a snapshot of the state at log position at.
func NewSnapshot(at uint64) *Snapshot { return &Snapshot{at: at} }

// AddRecords adds records sent before any contents: a session's objects,
// or contents of n bytes copied with the session stopped (counted as sent
// with them).
func (rs *Snapshot) AddRecords(recs []replicate.Record, n uint64) {
	rs.meta = append(rs.meta, recs...)
	rs.total += n
	rs.done += n
}

// AddMemory adds the allocations of session whose contents mem, a
// point-in-time copy the snapshot releases once read (or closed), holds.
func (rs *Snapshot) AddMemory(session uint64, mem gpu.MemorySnapshot, parts []Part) {
	rs.mems = append(rs.mems, mem)
	for _, p := range parts {
		rs.parts = append(rs.parts, contentPart{session: session, mem: mem, Part: p})
		rs.total += p.Size
	}
}

// Paused notes how long guests were stopped for it.
func (rs *Snapshot) Paused(d time.Duration) { rs.pause = d }

// At implements replicate.Snapshot.
func (rs *Snapshot) At() uint64 { return rs.at }

// Pause implements replicate.Snapshot.
func (rs *Snapshot) Pause() time.Duration { return rs.pause }

// Progress implements replicate.Snapshot.
func (rs *Snapshot) Progress() (uint64, uint64) { return rs.done, rs.total }

// Next implements replicate.Snapshot: the objects, then the contents read
// from the memory snapshots straight into body, as much as it has room
// for, then the end.
func (rs *Snapshot) Next(body []byte) (replicate.Record, bool, error) {
	if len(rs.meta) > 0 {
		rec := rs.meta[0]
		rs.meta[0] = replicate.Record{} // let it go
		rs.meta = rs.meta[1:]
		return rec, true, nil
	}
	for len(rs.parts) > 0 && rs.parts[0].off == rs.parts[0].Size {
		rs.parts = rs.parts[1:]
	}
	if len(rs.parts) == 0 {
		if rs.ended {
			return replicate.Record{}, false, nil
		}
		rs.ended = true
		rs.Close() // nothing more to read
		return replicate.Record{Op: replicate.OpSnapshotEnd, Result: rs.at}, true, nil
	}
	p := &rs.parts[0]
	if cap(body)-len(body) <= copyPrefix {
		return replicate.Record{}, false, fmt.Errorf("no room for a resync record (%d bytes)", cap(body)-len(body))
	}
	n := min(p.Size-p.off, uint64(cap(body)-len(body)-copyPrefix))
	body = appendCopyPrefix(body, p.Addr+p.off, n)
	data := body[len(body) : len(body)+int(n)]
	if err := p.mem.ReadAt(data, p.Dev+p.off); err != nil {
		return replicate.Record{}, false, fmt.Errorf("session %d: reading %#x from its memory snapshot: %w", p.session, p.Addr+p.off, err)
	}
	p.off += n
	rs.done += n
	return replicate.Record{Session: p.session, Op: replicate.Op(abi.OpCopyHtoD), Flags: replicate.FlagPlaced, Body: body[:len(body)+int(n)]}, true, nil
}

// copyPrefix is the size of an abi.CopyHtoD body before its data.
var copyPrefix = len((&abi.CopyHtoD{}).Append(nil))

// appendCopyPrefix appends the fields of an abi.CopyHtoD body of n bytes
// to dst (on the null stream) that come before its data, which the caller
// then reads in place after them: the encoding's last field before the
// data is the data's length.
func appendCopyPrefix(b []byte, dst, n uint64) []byte {
	b = (&abi.CopyHtoD{Dst: dst}).Append(b)
	binary.LittleEndian.PutUint32(b[len(b)-4:], uint32(n))
	return b
}

// Close implements replicate.Snapshot: the backends let go of their copies.
func (rs *Snapshot) Close() {
	for _, m := range rs.mems {
		m.Release()
	}
	rs.mems = nil
}
