package hypervisor

import (
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
)

// Read-backs: what a guest reads, the standby holds.
//
// Replication replays the guest's operations, which assumes a kernel run
// twice writes the same bytes. Kernels with floating-point atomics (split-K
// GEMMs, scatter-add and pooling backward passes) do not: the order in
// which their threads add differs from run to run, and so do the last bits
// of the sum. Frameworks use them without being asked to. So every read a
// replicated guest makes from device memory is logged as the equivalent
// write of the bytes it got (FlagReadBack): the standby applies it in log
// order, and after a failover the guest never reads a value different from
// one it read before. Under commit mode the read's reply waits for the
// record like any commit point. The cost is the bytes read, once more, on
// the replication link; what the guest never read may differ in its last
// bits between the nodes until verify --repair (or a later read) fixes it.
// A large read, where replies wait for the standby, goes as a check
// instead, and its bytes only where the standby's differ (checked, and
// replicate/readcheck.go).
//
// A read-back holds the bytes the device returned, never bytes a guest can
// change after the copy. A reply is the node's own memory (readBacks take
// the read-back from it). A copy into the guest's host-memory region
// (copy_dtoh_hostmem) lands where any guest thread may rewrite it at any
// moment, so a replicated session runs it through a log buffer instead
// (readsThroughLog): the device copies into the buffer, the buffer is
// copied into the region, and the log takes the buffer as the read-back.
// That is no extra copy: before, the read-back was copied out of the
// region.

// readBackOf logs the read-back of a successful read of op, whose request
// and reply are req and reply.
// Precondition: s.mu must be locked; s.record is set.
type readBackOf func(s *Session, req, reply abi.Body)

var readBacks = map[abi.Opcode]readBackOf{
	abi.OpCopyDtoH: func(s *Session, req, reply abi.Body) {
		r := req.(*abi.CopyDtoH)
		data := reply.(*abi.DataReply).Data
		if s.record.checked(r.Src, r.Stream, data) {
			return
		}
		if piece := s.record.piece(); piece > 0 && len(data) > piece {
			s.record.readBackPieces(r.Src, r.Stream, data) // the reply is the node's own memory
			return
		}
		d, buf := s.record.copyDraft(r.Src, r.Stream, len(data))
		copy(buf, data)
		s.record.readBack(d, r.Src, r.Stream)
	},
	abi.OpGlobalRead: func(s *Session, req, reply abi.Body) {
		r := req.(*abi.GlobalRead)
		w := &abi.GlobalWrite{Module: r.Module, Name: r.Name, Offset: r.Offset, Data: reply.(*abi.DataReply).Data}
		s.record.append(replicate.Op(abi.OpGlobalWrite), 0, w.Append(nil), 0, replicate.FlagReadBack, nil)
	},
}

// readsThroughLog are the reads a replicated session runs in place of
// their opTable handler, because the bytes they read land in memory the
// guest shares: each logs its own read-back.
var readsThroughLog = map[abi.Opcode]handler{
	abi.OpCopyDtoHHost: typed((*Session).copyDtoHHostLogged),
}

// handlerOf is the handler that runs op on this session: a replicated
// session's reads into shared memory go through the log (readsThroughLog).
// Precondition: s.mu must be locked.
func (s *Session) handlerOf(op abi.Opcode) handler {
	if s.record != nil {
		if h := readsThroughLog[op]; h != nil {
			return h
		}
	}
	return opTable[op]
}

// recordReadBack logs the read-back of a successful read (readBacks). A
// large one goes as pieces the log's fairness asks for
// (replicate.Log.Piece: other guests' records go in between, instead of
// waiting behind the whole read), each a write of its part in order.
// Precondition: s.mu must be locked; s.record is set.
func (s *Session) recordReadBack(op abi.Opcode, req, reply abi.Body) {
	if of := readBacks[op]; of != nil {
		of(s, req, reply)
	}
}

// copyDtoHHostLogged is a replicated session's copy_dtoh_hostmem: the
// device's bytes go into a log buffer (a copy_htod body to where they came
// from), are copied into the guest's region from there, and the buffer is
// logged as the read-back, so the record holds what the device returned
// even while a guest thread rewrites its region.
// Precondition: s.mu must be locked; s.record is set.
func (s *Session) copyDtoHHostLogged(r *abi.HostCopy) (abi.Body, error) {
	var d *replicate.Draft
	reply, err := s.mem.CopyDtoHHostThrough(r, func(n int) []byte {
		var buf []byte
		d, buf = s.record.copyDraft(r.Dev, r.Stream, n)
		return buf
	})
	if err != nil {
		if d != nil {
			d.Discard()
		}
		return nil, err
	}
	if s.record.checked(r.Dev, r.Stream, d.Body()[abi.CopyPrefixSize:]) {
		d.Discard()
		return reply, nil
	}
	s.record.readBack(d, r.Dev, r.Stream)
	return reply, nil
}

// checked logs a read of data from addr on stream as a read check
// (replicate.OpReadCheck) where the hook's replies wait and the read is
// large, and waits until the sync set applied it: true when every
// standby there holds the bytes, false when they must be logged (a
// standby asked for them, none confirmed, or no check was made). A read
// of the session waits here, under its lock, so nothing the session does
// after the read comes before its bytes in the log.
func (h *logHook) checked(addr, stream uint64, data []byte) bool {
	if least := h.log.ReadCheckMin(); !h.repliesWait || least == 0 || int64(len(data)) < least {
		return false
	}
	c := replicate.ReadCheck{Addr: addr, Stream: stream, N: uint64(len(data)), Sum: gpu.Checksum(data)}
	seq := h.log.Append(replicate.Record{Session: h.session, Op: replicate.OpReadCheck, Body: replicate.AppendReadCheck(nil, c)})
	confirmed := h.log.WaitApplied(seq)
	return !h.log.TakeReadNeed(seq) && confirmed
}

// copyDraft is a log buffer holding a copy_htod of n bytes to dst on
// stream, and the part of it where those bytes go. n is at most a frame's
// payload (the read that returned them was checked against it).
func (h *logHook) copyDraft(dst, stream uint64, n int) (*replicate.Draft, []byte) {
	d := h.log.NewDraft(abi.CopyPrefixSize + n)
	body := d.Body()
	abi.AppendCopyHtoDPrefix(body[:0], dst, stream, uint32(n))
	return d, body[abi.CopyPrefixSize:]
}

// readBack logs a copyDraft to dst on stream, filled, as a read-back; the
// log takes it.
// Where the log's fairness asks for pieces (piece), its bytes go as pieces
// in order instead, and the draft is dropped.
func (h *logHook) readBack(d *replicate.Draft, dst, stream uint64) {
	body := d.Body()
	if piece := h.piece(); piece > 0 && len(body)-abi.CopyPrefixSize > piece {
		h.readBackPieces(dst, stream, body[abi.CopyPrefixSize:])
		d.Discard()
		return
	}
	h.append(replicate.Op(abi.OpCopyHtoD), 0, body, 0, replicate.FlagReadBack, d)
}

// readBackPieces logs the read-back of data, read from dst on stream, as
// pieces of the log's piece size.
func (h *logHook) readBackPieces(dst, stream uint64, data []byte) {
	piece := h.piece()
	for off := 0; off < len(data); off += piece {
		h.readBackPart(&abi.CopyHtoD{Dst: dst + uint64(off), Stream: stream, Data: data[off:min(off+piece, len(data))]})
	}
}

// readBackPart logs one piece of a read-back.
func (h *logHook) readBackPart(part *abi.CopyHtoD) {
	h.appendPart(part, 0, 0, replicate.FlagReadBack)
}

// appendPart logs a write of part (a piece of a larger one), encoded
// straight into the log's buffer (a draft: its bytes are copied once).
func (h *logHook) appendPart(part *abi.CopyHtoD, reqID, result uint64, flags uint16) {
	d := h.log.NewDraft(abi.CopyPrefixSize + len(part.Data))
	body := d.Body()
	copy(body[abi.CopyPrefixSize:], part.Data)
	abi.AppendCopyHtoDPrefix(body[:0], part.Dst, part.Stream, uint32(len(part.Data)))
	h.append(replicate.Op(abi.OpCopyHtoD), reqID, body, result, flags, d)
}

// appendWritePieces logs a guest's large write (copy_htod) as the pieces
// the log's fairness asks for (replicate.Log.Piece), so that other
// guests' records go in between: every piece but the last without a
// request id (a write of its part), the last with the request's id and,
// in Result, sum: the exactly-once sum of the whole request
// (replicate.FlagPieces). A standby that takes over between two pieces
// has not applied the request: the guest resends it whole, and it runs
// whole (the same bytes to the same place). It reports false for a write
// that goes as one record.
func (h *logHook) appendWritePieces(reqID uint64, w *abi.CopyHtoD, sum uint32) bool {
	piece := h.piece()
	if piece <= 0 || len(w.Data) <= piece || reqID == 0 {
		return false
	}
	for off := 0; off < len(w.Data); off += piece {
		end := min(off+piece, len(w.Data))
		part := &abi.CopyHtoD{Dst: w.Dst + uint64(off), Stream: w.Stream, Data: w.Data[off:end]}
		if end < len(w.Data) {
			h.appendPart(part, 0, 0, 0)
		} else {
			h.appendPart(part, reqID, uint64(sum), replicate.FlagPieces)
		}
	}
	return true
}
