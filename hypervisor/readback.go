package hypervisor

import (
	"hash/crc32"

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

// readBackOf returns the write that puts what a successful read returned
// where it came from, or nil for an op that reads nothing.
// Precondition: s.mu must be locked.
type readBackOf func(s *Session, req, reply abi.Body) (abi.Opcode, abi.Body)

var readBacks = map[abi.Opcode]readBackOf{
	abi.OpCopyDtoH: func(s *Session, req, reply abi.Body) (abi.Opcode, abi.Body) {
		r := req.(*abi.CopyDtoH)
		return abi.OpCopyHtoD, &abi.CopyHtoD{Dst: r.Src, Stream: r.Stream, Data: reply.(*abi.DataReply).Data}
	},
	abi.OpCopyDtoHHost: func(s *Session, req, _ abi.Body) (abi.Opcode, abi.Body) {
		r := req.(*abi.HostCopy)
		data, err := s.mem.HostSpan(r) // checked by the read that just succeeded
		if err != nil {
			return 0, nil
		}
		return abi.OpCopyHtoD, &abi.CopyHtoD{Dst: r.Dev, Stream: r.Stream, Data: data}
	},
	abi.OpGlobalRead: func(s *Session, req, reply abi.Body) (abi.Opcode, abi.Body) {
		r := req.(*abi.GlobalRead)
		return abi.OpGlobalWrite, &abi.GlobalWrite{Module: r.Module, Name: r.Name, Offset: r.Offset, Data: reply.(*abi.DataReply).Data}
	},
}

// recordReadBack logs the read-back of a successful read (readBacks). A
// large one goes as pieces the log's fairness asks for
// (replicate.Log.Piece: other guests' records go in between, instead of
// waiting behind the whole read), each a write of its part in order.
// Precondition: s.mu must be locked; s.record is set.
func (s *Session) recordReadBack(op abi.Opcode, req, reply abi.Body) {
	of := readBacks[op]
	if of == nil {
		return
	}
	wop, w := of(s, req, reply)
	if w == nil {
		return
	}
	if c, ok := w.(*abi.CopyHtoD); ok {
		if piece := s.record.piece(); piece > 0 && len(c.Data) > piece {
			for off := 0; off < len(c.Data); off += piece {
				s.record.readBackPart(&abi.CopyHtoD{Dst: c.Dst + uint64(off), Stream: c.Stream, Data: c.Data[off:min(off+piece, len(c.Data))]})
			}
			return
		}
	}
	s.record.append(replicate.Op(wop), 0, w.Append(nil), 0, replicate.FlagReadBack, nil)
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
// in Result, the exactly-once sum of the whole request
// (replicate.FlagPieces). A standby that takes over between two pieces
// has not applied the request: the guest resends it whole, and it runs
// whole (the same bytes to the same place). It reports false for a write
// that goes as one record.
func (h *logHook) appendWritePieces(reqID uint64, w *abi.CopyHtoD, payload []byte) bool {
	piece := h.piece()
	if piece <= 0 || len(w.Data) <= piece || reqID == 0 {
		return false
	}
	sum := crc32.Checksum(payload, castagnoli)
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

// castagnoli is the exactly-once sum's polynomial (package exactlyonce).
var castagnoli = crc32.MakeTable(crc32.Castagnoli)
