package ptrace

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vgpuha/vgpuha/mmiotrace/x86store"
)

// waitSyscallsArch are the waits (see waitSyscalls) that only some
// architectures have. (A compat call made with INT 0x80 shows its i386
// number: none of i386's calls that pin memory has the number of one of
// these or waitSyscalls.)
var waitSyscallsArch = []int{unix.SYS_EPOLL_WAIT, unix.SYS_POLL, unix.SYS_SELECT, unix.SYS_PAUSE}

// The x86-64 half of the ptrace modes: the register layout, system-call
// injection and the XSAVE area. arch_linux_other.go says why other
// architectures have none of it.

// findSyscallInsn finds the bytes of a SYSCALL instruction (0f 05) in the
// guest's vDSO (or, failing that, any executable mapping): injected
// system calls jump there.
func findSyscallInsn(pid int, mem *os.File) (uint64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	type span struct{ lo, hi uint64 }
	var vdso, exec []span
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || fields[1][2] != 'x' {
			continue
		}
		var s span
		if _, err := fmt.Sscanf(fields[0], "%x-%x", &s.lo, &s.hi); err != nil {
			continue
		}
		if len(fields) >= 6 && fields[5] == "[vdso]" {
			vdso = append(vdso, s)
		} else if len(fields) >= 6 && fields[5] != "[vsyscall]" {
			exec = append(exec, s)
		}
	}
	for _, s := range append(vdso, exec...) {
		buf := make([]byte, min(s.hi-s.lo, 1<<20))
		n, _ := mem.ReadAt(buf, int64(s.lo))
		if i := bytes.Index(buf[:n], []byte{0x0f, 0x05}); i >= 0 {
			return s.lo + uint64(i), nil
		}
	}
	return 0, fmt.Errorf("guest %d: no SYSCALL instruction found in its executable mappings", pid)
}

// Inject runs one system call in stopped thread tid and returns its
// result, leaving the thread's registers as they were. The thread may be
// stopped inside a system call of its own: orig_rax is set to -1 so the
// kernel does not restart it over ours, and restored after.
func (p *Process) Inject(tid int, nr uintptr, args ...uint64) (int64, error) {
	var saved unix.PtraceRegs
	if err := unix.PtraceGetRegs(tid, &saved); err != nil {
		return 0, err
	}
	r := saved
	r.Rip, r.Rax, r.Orig_rax = p.sysInsn, uint64(nr), ^uint64(0)
	regs := []*uint64{&r.Rdi, &r.Rsi, &r.Rdx, &r.R10, &r.R8, &r.R9}
	for i, a := range args {
		*regs[i] = a
	}
	if err := unix.PtraceSetRegs(tid, &r); err != nil {
		return 0, err
	}
	if err := p.SingleStep(tid); err != nil {
		return 0, err
	}
	if err := unix.PtraceGetRegs(tid, &r); err != nil {
		return 0, err
	}
	if err := unix.PtraceSetRegs(tid, &saved); err != nil {
		return 0, err
	}
	return int64(r.Rax), nil
}

// Regs reads a stopped thread's registers; vec adds the vector registers.
func (p *Process) Regs(tid int, vec bool) (*x86store.Regs, *unix.PtraceRegs, error) {
	var raw unix.PtraceRegs
	if err := unix.PtraceGetRegs(tid, &raw); err != nil {
		return nil, nil, err
	}
	r := &x86store.Regs{
		GPR: [16]uint64{raw.Rax, raw.Rcx, raw.Rdx, raw.Rbx, raw.Rsp, raw.Rbp, raw.Rsi, raw.Rdi,
			raw.R8, raw.R9, raw.R10, raw.R11, raw.R12, raw.R13, raw.R14, raw.R15},
		RIP: raw.Rip, RFlags: raw.Eflags, FSBase: raw.Fs_base, GSBase: raw.Gs_base,
	}
	if vec {
		if err := ReadVectors(tid, r); err != nil {
			return nil, nil, err
		}
	}
	return r, &raw, nil
}

// SetRegs writes back what an emulated instruction changed.
func SetRegs(tid int, r *x86store.Regs, raw *unix.PtraceRegs) error {
	g := r.GPR
	raw.Rax, raw.Rcx, raw.Rdx, raw.Rbx, raw.Rsp, raw.Rbp, raw.Rsi, raw.Rdi = g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]
	raw.R8, raw.R9, raw.R10, raw.R11, raw.R12, raw.R13, raw.R14, raw.R15 = g[8], g[9], g[10], g[11], g[12], g[13], g[14], g[15]
	raw.Rip = r.RIP
	return unix.PtraceSetRegs(tid, raw)
}

// ReadVectors fills r.Vec from the thread's XSAVE area: XMM registers at
// offset 160 of the legacy region, the upper YMM halves at 576 (the
// standard, uncompacted layout ptrace returns).
func ReadVectors(tid int, r *x86store.Regs) error {
	buf := make([]byte, 4096)
	n, err := ptraceGetRegset(tid, unix.NT_X86_XSTATE, buf)
	if err != nil {
		return fmt.Errorf("reading vector registers: %w", err)
	}
	for i := range r.Vec {
		copy(r.Vec[i][:16], buf[160+16*i:])
		if n >= 576+256 {
			copy(r.Vec[i][16:], buf[576+16*i:])
		}
	}
	return nil
}
