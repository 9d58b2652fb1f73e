// Package kmod holds vgpuha's kernel-side helpers. Today that is one eBPF
// program, FaultCounter: it counts a process's user page faults inside an
// address range, as the kernel sees them, from the
// exceptions:page_fault_user tracepoint. It is an independent check on the
// MMIO tracer (which counts only the faults it handles: in uffd mode the
// kernel resolves write faults itself and the tracer sees none); `vgpuha
// bench mmio` reports it beside the tracer's count. It never changes
// anything: it only counts.
//
// The program is written with cilium/ebpf's assembler, so building it needs
// no clang. Loading it needs root (CAP_BPF and CAP_PERFMON) and tracefs; an
// in-kernel variant of the tracer (a kernel module, tested in a VM) is not
// built yet.
package kmod

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// FaultCounter counts page faults of one process inside [lo, hi).
type FaultCounter struct {
	counts *ebpf.Map // index 0: faults on reads, 1: faults on writes
	prog   *ebpf.Program
	link   link.Link
}

// Offsets in the page_fault_user tracepoint record
// (/sys/kernel/tracing/events/exceptions/page_fault_user/format).
const (
	offAddress   = 8
	offErrorCode = 24
	errWrite     = 1 << 1 // x86 page-fault error code: the access was a write
)

// NewFaultCounter starts counting the faults of process tgid in [lo, hi).
func NewFaultCounter(tgid int, lo, hi uint64) (*FaultCounter, error) {
	if err := ensureTracefs(); err != nil {
		return nil, err
	}
	counts, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 2})
	if err != nil {
		return nil, fmt.Errorf("kmod: creating the counter map (needs root): %w", err)
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.TracePoint,
		License:      "GPL",
		Instructions: faultProgram(counts.FD(), tgid, lo, hi),
	})
	if err != nil {
		counts.Close()
		return nil, fmt.Errorf("kmod: loading the fault counter: %w", err)
	}
	l, err := link.Tracepoint("exceptions", "page_fault_user", prog, nil)
	if err != nil {
		prog.Close()
		counts.Close()
		return nil, fmt.Errorf("kmod: attaching to exceptions:page_fault_user: %w", err)
	}
	return &FaultCounter{counts: counts, prog: prog, link: l}, nil
}

// faultProgram: if the current process is tgid and the faulting address
// lies in [lo, hi), add one to counts[(error_code >> 1) & 1].
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

// Counts returns the faults counted so far: on reads and on writes.
func (f *FaultCounter) Counts() (reads, writes uint64, err error) {
	if err := f.counts.Lookup(uint32(0), &reads); err != nil {
		return 0, 0, err
	}
	err = f.counts.Lookup(uint32(1), &writes)
	return reads, writes, err
}

// Close detaches and unloads the program.
func (f *FaultCounter) Close() error {
	return errors.Join(f.link.Close(), f.prog.Close(), f.counts.Close())
}

// ensureTracefs mounts tracefs where cilium/ebpf looks for tracepoint ids,
// if nothing is mounted there yet.
func ensureTracefs() error {
	const dir = "/sys/kernel/tracing"
	if _, err := os.Stat(dir + "/events"); err == nil {
		return nil
	}
	if err := unix.Mount("tracefs", dir, "tracefs", 0, ""); err != nil {
		return fmt.Errorf("kmod: tracefs is not mounted at %s and mounting it failed (needs root): %w", dir, err)
	}
	return nil
}
