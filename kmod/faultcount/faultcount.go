// Package faultcount is an eBPF program that counts a process's user page
// faults inside an address range, as the kernel sees them, from the
// exceptions:page_fault_user tracepoint. It is an independent check on the
// MMIO tracer (which counts only the faults it handles: in uffd mode the
// kernel resolves write faults itself and the tracer sees none); `vgpuha-lab
// bench mmio` reports it beside the tracer's count, and the kmod VM test
// checks the in-kernel tracer's own count against it. It never changes
// anything: it only counts. It is written with cilium/ebpf's assembler, so
// building it needs no clang; loading it needs root (CAP_BPF and
// CAP_PERFMON) and tracefs. The tracepoint and its page-fault error code
// are x86's (faults_amd64.go); elsewhere NewFaultCounter returns
// ErrUnsupportedArch.
//
// It is a package of its own so that the agent, which uses package kmod's
// device API for the kmod tracing modes, links no eBPF loader: only the lab
// and the tests count faults.
package faultcount

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// ErrUnsupportedArch: the fault counter needs x86's
// exceptions:page_fault_user tracepoint.
var ErrUnsupportedArch = errors.New("kmod: unsupported on this architecture")

// FaultCounter counts page faults of one process inside [lo, hi).
type FaultCounter struct {
	counts *ebpf.Map // index 0: faults on reads, 1: faults on writes
	prog   *ebpf.Program
	link   link.Link
}

// newFaultCounter loads prog (which counts into a two-entry array map,
// given its descriptor) and attaches it to tracepoint group:name.
func newFaultCounter(group, name string, prog func(mapFD int) asm.Instructions) (*FaultCounter, error) {
	if err := ensureTracefs(); err != nil {
		return nil, err
	}
	counts, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 2})
	if err != nil {
		return nil, fmt.Errorf("kmod: creating the counter map (needs root): %w", err)
	}
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.TracePoint,
		License:      "GPL",
		Instructions: prog(counts.FD()),
	})
	if err != nil {
		counts.Close()
		return nil, fmt.Errorf("kmod: loading the fault counter: %w", err)
	}
	l, err := link.Tracepoint(group, name, p, nil)
	if err != nil {
		p.Close()
		counts.Close()
		return nil, fmt.Errorf("kmod: attaching to %s:%s: %w", group, name, err)
	}
	return &FaultCounter{counts: counts, prog: p, link: l}, nil
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
