package mmiotrace

import "golang.org/x/sys/unix"

// The x86-64 half of the ptrace modes is package ptrace's (its register
// layout, system-call injection and the XSAVE area); what the tracer
// itself needs to know of the architecture is here.

// ptraceArchErr reports whether the ptrace modes work on this
// architecture: they do on x86-64.
func ptraceArchErr(Mode) error { return nil }

// waitSyscallsArch are the waits (see waitSyscalls) that only some
// architectures have. (A compat call made with INT 0x80 shows its i386
// number: none of i386's calls that pin memory has the number of one of
// these or waitSyscalls.)
var waitSyscallsArch = []int{unix.SYS_EPOLL_WAIT, unix.SYS_POLL, unix.SYS_SELECT, unix.SYS_PAUSE}
