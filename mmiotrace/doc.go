// Package mmiotrace catches a guest process's direct writes to memory it
// shares with the hypervisor (apertures: mapped device memory), so they can
// be replicated like calls. It owns the tracing mechanisms and the x86
// store decoder; it never decides what a write means or where it goes
// (the hypervisor turns Flush output into log records), and it never
// changes guest memory outside the regions it was given.
//
// It is the one place that reaches into a guest process — ptrace,
// userfaultfd, pidfd_getfd, SO_PEERCRED, /proc/PID/{maps,mem,pagemap} —
// so the hypervisor has no system calls of its own (it takes a guest's
// memory with MapGuestFile): the tracer's guarantees rest on how that
// memory was taken (a sealed file, mapped writable once by the guest).
// unsafe appears only in *_unsafe.go (pointers handed to the kernel);
// x86-64 registers and system-call injection only in *_amd64.go, with
// stubs elsewhere that return ErrUnsupportedArch. The decoder is portable
// Go: it decodes x86-64 bytes on any host.
//
// Modes (measured costs in the README):
//   - insn: the regions stay write-protected; each store faults, the tracer
//     (ptrace) reads the registers and the instruction, decodes it with
//     x86asm and emulates it — writes the value through its own mapping and
//     advances RIP — so the page is never writable for any thread. A
//     read-modify-write (LOCK XADD…) is single-stepped with the page
//     unprotected and the other threads stopped, and the bytes at the
//     decoded address recorded; an instruction the decoder cannot describe
//     is stepped the same way and the page compared before and after.
//   - page: the first write to a page after a flush faults; the tracer
//     unprotects the page and marks it dirty. A flush re-protects the dirty
//     pages (an mprotect injected into a stopped guest thread) and sends the
//     ranges that changed since the previous flush.
//   - uffd: page tracking by the kernel alone: the guest driver arms
//     userfaultfd's asynchronous write-protection (ArmWriteTracking) and a
//     flush collects and re-arms written pages with one PAGEMAP_SCAN ioctl
//     on /proc/PID/pagemap. No fault ever leaves the kernel.
//   - off: nothing is traced.
//
// Register regions (doorbells) are traced one write at a time in every mode
// but off. Reads are never trapped (write-protect, not unmap).
//
// The tracer runs in the hypervisor's process. Linux ties ptrace to the
// thread that attached, so all ptrace work runs on one locked OS thread;
// with Options.Pin that thread and the guest's threads share one CPU.
// Limits: the guest must run in a process group of its own (the tracer
// waits on that group only); a system call that writes into a protected
// region (read(2) into an aperture) fails with EFAULT in the ptrace modes
// (uffd mode has no such limit); the guest's job-control stops are not kept
// while it is traced.
package mmiotrace
