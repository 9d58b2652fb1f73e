package hypervisor

import (
	"time"

	"github.com/vgpuha/vgpuha/hypervisor/replica"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
)

// A resync snapshot (package replica says how it keeps a guest's pause
// short): the primary stops every session for a moment, takes each one's
// objects as records and its device memory as a point-in-time copy where
// the backend can, and lets guests run again while the sender reads it.

// Snapshot implements replicate.Protected: a resync snapshot whose guest
// pause does not grow with device memory.
func (s *Server) Snapshot() (replicate.Snapshot, error) {
	var snap *replica.Snapshot
	var err error
	s.stopTheWorld(func(sessions []*Session) {
		start := time.Now()
		snap = replica.NewSnapshot(s.repl.BeginSnapshot())
		s.images.ResetShipped() // the standby starts afresh from this snapshot
		for _, sess := range sessions {
			snap.AddRecords(sess.objectRecords(), 0)
			if err = sess.mem.Snapshot(sess.id, snap, s.log); err != nil {
				return
			}
		}
		snap.Paused(time.Since(start))
	})
	if err != nil {
		snap.Close()
		return nil, err
	}
	return snap, nil
}

// objectRecords returns records that recreate this session's objects at
// the addresses and handles they have, without their memory's contents.
// Precondition: s.mu must be locked.
func (s *Session) objectRecords() []replicate.Record {
	open := sessionOpen{Guest: s.guest, Token: s.token, Tenant: s.tenantID, Grace: s.grace, GraceKnown: true, GPU: s.pin, Device: s.shown}
	recs := []replicate.Record{{Session: s.id, Op: replicate.OpSessionOpen, Result: s.mem.Base(), Body: open.Append(nil)}}
	for _, r := range s.mem.Ranges() {
		if !s.mem.Mapped(r.Addr) {
			recs = append(recs, placed(s.id, abi.OpAlloc, &abi.Alloc{Size: r.Size}, r.Addr))
		}
	}
	s.mem.MappingRecords(func(op abi.Opcode, body abi.Body, addr uint64) {
		recs = append(recs, placed(s.id, op, body, addr))
	})
	recs = append(recs, s.objs.Records(func(op abi.Opcode, body abi.Body, result uint64) replicate.Record {
		return placed(s.id, op, body, result)
	})...)
	s.objs.GlobalRecords(func(r *abi.ModuleGlobal, guest uint64) {
		recs = append(recs, replicate.Record{Session: s.id, Op: replicate.OpGlobalAddr, Result: guest, Body: r.Append(nil)})
	})
	s.objs.TensorMapRecords(func(r *abi.TensorMapEncode, guest [abi.TensorMapBytes]byte) {
		recs = append(recs, replicate.Record{Session: s.id, Op: replicate.OpTensorMap, Body: replicate.AppendTensorMap(nil, r, guest)})
	})
	recs = append(recs, replicate.Record{Session: s.id, Op: replicate.OpSetNext, Result: uint64(s.objs.Next()), ReqID: s.once.Last(),
		Body: s.once.AppendApplied(nil)})
	return append(recs, s.failureRecords()...)
}

func placed(session uint64, op abi.Opcode, body abi.Body, result uint64) replicate.Record {
	return replicate.Record{Session: session, Op: replicate.Op(op), Flags: replicate.FlagPlaced, Result: result, Body: body.Append(nil)}
}
