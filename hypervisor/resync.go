package hypervisor

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"time"

	"github.com/vgpuha/vgpuha/handlemap"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
)

// A resync snapshot stops guests only for a moment. With every session
// stopped it fixes the log position S (Log.BeginSnapshot), builds the
// records that recreate each session's objects (sessions, allocations,
// modules, functions, streams, handle counters: O(objects), no device
// memory), and asks the backend for a point-in-time copy of the sessions'
// device memory (gpu.Snapshotter: copy-on-write on the software GPU, a
// device-to-device copy on CUDA). Guests then run again, and the sender
// pulls the contents out of that copy, read straight into the buffer it
// seals and sends (the bytes are copied once on the primary), while
// the log keeps every change after S. The standby applies the state at S,
// then the log after S: whatever a guest wrote meanwhile (a copy, a
// memset, a device-to-device copy, an aperture flush, or a kernel writing
// through pointers it found in memory), the replica ends up identical,
// because the snapshot never sees a write after S and the log has them
// all. A session whose backend cannot take such a copy is copied the old
// way, with it stopped, into records held until sent.

// snapshotChunk bounds the data in one record of contents copied with the
// session stopped (a backend without memory snapshots); a memory
// snapshot's records are as large as the sender's buffers.
const snapshotChunk = 1 << 20

// resyncSnapshot implements replicate.Snapshot.
type resyncSnapshot struct {
	at    uint64
	pause time.Duration
	meta  []replicate.Record // objects (and copied-the-old-way contents), sent first
	parts []contentPart      // device memory still to read
	mems  []gpu.MemorySnapshot
	total uint64
	done  uint64
	ended bool
}

// contentPart is one allocation's contents to read from a memory snapshot.
type contentPart struct {
	session uint64
	mem     gpu.MemorySnapshot
	addr    uint64 // guest address
	dev     uint64 // device address
	size    uint64
	off     uint64 // bytes already read
}

// Snapshot implements replicate.Protected: a resync snapshot whose guest
// pause does not grow with device memory.
func (s *Server) Snapshot() (replicate.Snapshot, error) {
	snap := &resyncSnapshot{}
	var err error
	s.stopTheWorld(func(sessions []*Session) {
		start := time.Now()
		snap.at = s.repl.BeginSnapshot()
		s.images.ResetShipped() // the standby starts afresh from this snapshot
		for _, sess := range sessions {
			if err = snap.add(sess, s.log); err != nil {
				return
			}
		}
		snap.pause = time.Since(start)
	})
	if err != nil {
		snap.Close()
		return nil, err
	}
	return snap, nil
}

// add captures one session: its objects, and its memory as a backend
// snapshot (or, failing that, as records copied now).
// Precondition: sess.mu must be locked.
func (rs *resyncSnapshot) add(sess *Session, log *slog.Logger) error {
	rs.meta = append(rs.meta, sess.objectRecords()...)
	all := sess.mem.ranges.All()
	if len(all) == 0 {
		return nil
	}
	ranges := make([]gpu.Range, len(all))
	for i, r := range all {
		ranges[i] = gpu.Range{Addr: sess.mem.dev(r.Addr), Size: r.Size}
		rs.total += r.Size
	}
	if sn, ok := sess.ctx.(gpu.Snapshotter); ok {
		mem, err := sn.SnapshotMemory(ranges)
		if err == nil {
			rs.mems = append(rs.mems, mem)
			for _, r := range all {
				rs.parts = append(rs.parts, contentPart{session: sess.id, mem: mem, addr: r.Addr, dev: sess.mem.dev(r.Addr), size: r.Size})
			}
			return nil
		}
		log.Warn("no point-in-time memory snapshot; copying this session's memory with it stopped", "session", sess.id, "err", err)
	}
	for _, r := range all {
		recs, err := sess.mem.contentRecords(sess.id, r, replicate.FlagPlaced)
		if err != nil {
			return fmt.Errorf("session %d: reading allocation %#x for a snapshot: %w", sess.id, r.Addr, err)
		}
		rs.meta = append(rs.meta, recs...)
	}
	rs.done += sumSizes(all) // counted as sent with the objects
	return nil
}

func sumSizes(rs []handlemap.Range) uint64 {
	var n uint64
	for _, r := range rs {
		n += r.Size
	}
	return n
}

// objectRecords returns records that recreate this session's objects at
// the addresses and handles they have, without their memory's contents.
// Precondition: s.mu must be locked.
func (s *Session) objectRecords() []replicate.Record {
	open := sessionOpen{guest: s.guest, token: s.token, tenant: s.tenantID, grace: s.grace, graceKnown: true}
	recs := []replicate.Record{{Session: s.id, Op: replicate.OpSessionOpen, Result: s.mem.base, Body: open.append(nil)}}
	for _, r := range s.mem.ranges.All() {
		recs = append(recs, placed(s.id, abi.OpAlloc, &abi.Alloc{Size: r.Size}, r.Addr))
	}
	recs = append(recs, s.objs.Records(func(op abi.Opcode, body abi.Body, result uint64) replicate.Record {
		return placed(s.id, op, body, result)
	})...)
	return append(recs, replicate.Record{Session: s.id, Op: replicate.OpSetNext, Result: uint64(s.objs.Next()), ReqID: s.once.Last(),
		Body: s.once.AppendApplied(nil)})
}

func placed(session uint64, op abi.Opcode, body abi.Body, result uint64) replicate.Record {
	return replicate.Record{Session: session, Op: replicate.Op(op), Flags: replicate.FlagPlaced, Result: result, Body: body.Append(nil)}
}

// At implements replicate.Snapshot.
func (rs *resyncSnapshot) At() uint64 { return rs.at }

// Pause implements replicate.Snapshot.
func (rs *resyncSnapshot) Pause() time.Duration { return rs.pause }

// Progress implements replicate.Snapshot.
func (rs *resyncSnapshot) Progress() (uint64, uint64) { return rs.done, rs.total }

// Next implements replicate.Snapshot: the objects, then the contents read
// from the memory snapshots straight into body, as much as it has room
// for, then the end.
func (rs *resyncSnapshot) Next(body []byte) (replicate.Record, bool, error) {
	if len(rs.meta) > 0 {
		rec := rs.meta[0]
		rs.meta[0] = replicate.Record{} // let it go
		rs.meta = rs.meta[1:]
		return rec, true, nil
	}
	for len(rs.parts) > 0 && rs.parts[0].off == rs.parts[0].size {
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
	n := min(p.size-p.off, uint64(cap(body)-len(body)-copyPrefix))
	body = appendCopyPrefix(body, p.addr+p.off, n)
	data := body[len(body) : len(body)+int(n)]
	if err := p.mem.ReadAt(data, p.dev+p.off); err != nil {
		return replicate.Record{}, false, fmt.Errorf("session %d: reading %#x from its memory snapshot: %w", p.session, p.addr+p.off, err)
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
func (rs *resyncSnapshot) Close() {
	for _, m := range rs.mems {
		m.Release()
	}
	rs.mems = nil
}
