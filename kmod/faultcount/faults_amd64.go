package faultcount

import "github.com/cilium/ebpf/asm"

// Offsets in the page_fault_user tracepoint record
// (/sys/kernel/tracing/events/exceptions/page_fault_user/format; the
// tracepoint is x86's, arch/x86/include/asm/trace/exceptions.h).
const (
	offAddress   = 8
	offErrorCode = 24
	errWrite     = 1 << 1 // x86 page-fault error code: the access was a write
)

// NewFaultCounter starts counting the faults of process tgid in [lo, hi).
func NewFaultCounter(tgid int, lo, hi uint64) (*FaultCounter, error) {
	return newFaultCounter("exceptions", "page_fault_user", func(mapFD int) asm.Instructions {
		return faultProgram(mapFD, tgid, lo, hi)
	})
}

// faultProgram: if the current process is tgid and the faulting address
// lies in [lo, hi), add one to counts[(error_code >> 1) & 1] (errWrite).
func faultProgram(mapFD, tgid int, lo, hi uint64) asm.Instructions {
	return asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1), // the tracepoint record
		asm.FnGetCurrentPidTgid.Call(),
		asm.RSh.Imm(asm.R0, 32),
		asm.JNE.Imm(asm.R0, int32(tgid), "out"),
		asm.LoadMem(asm.R2, asm.R6, offAddress, asm.DWord),
		asm.LoadImm(asm.R3, int64(lo), asm.DWord),
		asm.JLT.Reg(asm.R2, asm.R3, "out"),
		asm.LoadImm(asm.R3, int64(hi), asm.DWord),
		asm.JGE.Reg(asm.R2, asm.R3, "out"),
		asm.LoadMem(asm.R4, asm.R6, offErrorCode, asm.DWord),
		asm.RSh.Imm(asm.R4, 1),
		asm.And.Imm(asm.R4, 1),
		asm.StoreMem(asm.RFP, -4, asm.R4, asm.Word),
		asm.LoadMapPtr(asm.R1, mapFD),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "out"),
		asm.Mov.Imm(asm.R1, 1),
		asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
		asm.Return(),
	}
}
