// Package ptrace owns mmiotrace's ptrace relationship with one guest
// process (Process): attaching to every thread, the event loop on one
// locked OS thread (Linux takes ptrace requests only from the thread that
// attached), work handed to that thread while a guest thread is stopped,
// stopping and resuming the others, single steps, system calls injected
// into a stopped thread (mprotect, and the kmod modes' open and mmap),
// the registers (x86store.Regs), the guest's memory through
// /proc/PID/mem, and which of its threads sit in a system call that may
// pin memory (ThreadWatch, from /proc/PID/task/TID/syscall).
//
// It does what the tracer asks and decides nothing: it never chooses
// which pages are protected or what a store means, and never delivers a
// signal of its own to the guest (its wake-up signal is caught, never
// delivered). unsafe appears only in *_unsafe.go, the x86-64 register
// layout and system-call injection only in arch_linux_amd64.go (stubs
// elsewhere return ErrUnsupportedArch).
package ptrace

import "errors"

// ErrUnsupportedArch: ptrace's register work needs x86-64 (never reached
// elsewhere: the tracer refuses the ptrace modes first).
var ErrUnsupportedArch = errors.New("mmiotrace: unsupported on this architecture")
