package hypervisor

import (
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

// recordReadBack logs the read-back of a successful read (readBacks).
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
	s.record.append(replicate.Op(wop), 0, w.Append(nil), 0, replicate.FlagReadBack, nil)
}
