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
//     advances RIP — so the page is never writable for any thread
//     (overlapping REP MOVS element by element, as the CPU copies). A
//     read-modify-write of a proven range (LOCK XADD…) is single-stepped
//     with the page unprotected and the other threads stopped, and the
//     operand's bytes recorded; anything whose reach the decoder cannot
//     prove (undecodable, BTS with a register bit offset, AVX-512 scatters
//     and other EVEX forms) is stepped the same way, every page the step
//     touches copied before it is unprotected, and exactly the bytes that
//     changed recorded.
//   - page: the first write to a page after a flush faults; the tracer
//     unprotects that page and every page after it to the region's end, and
//     marks them dirty (the open pages are always the end of the region, so
//     a system call writing from an open page never meets a protected one).
//     A flush re-protects the dirty pages (an mprotect injected into a
//     stopped guest thread) and sends the ranges that changed since the
//     previous flush.
//   - uffd: page tracking by the kernel alone: the guest driver arms
//     userfaultfd's asynchronous write-protection (ArmWriteTracking) and a
//     flush collects and re-arms written pages with one PAGEMAP_SCAN ioctl
//     on /proc/PID/pagemap. No fault ever leaves the kernel. Before it
//     compares those pages the flush settles: every guest thread is seen
//     (/proc/PID/task/TID/syscall) waiting — futex, poll, epoll, sleep,
//     wait — or in no system call, and the others (running, or in a call
//     that may pin memory: read, ioctl…) are stopped for a moment through
//     ptrace, which uffd mode attaches where it can (not the tracer's own
//     process, x86-64, permission). A page whose flush did not settle is
//     compared again at every flush until one does (a flush with at most
//     16 such pages does not try: comparing them costs less).
//   - off: nothing is traced.
//
// Register regions (doorbells) are traced one write at a time in every mode
// but off. Reads are never trapped (write-protect, not unmap).
//
// The rule: a write reaches the device copy and the standby, or the guest
// gets an error at the moment it tries. What happens, per mode (MapGuestFile
// seals the file F_SEAL_FUTURE_WRITE and requires MADV_DONTFORK; each flush
// of a ptrace mode asks the kernel which protected pages are writable):
//
//	guest does                          insn                      page                      uffd
//	plain store, REP STOS/MOVS          emulated, recorded        page compared at flush    page compared at flush
//	BTS reg far, scatter, undecodable   stepped, pages compared   page compared at flush    page compared at flush
//	write/pwrite/fallocate PUNCH_HOLE,  EPERM                     EPERM                     EPERM
//	  MADV_REMOVE, writable reopen/mmap
//	fork, child touches the aperture    child: SIGSEGV            child: SIGSEGV            child: SIGSEGV
//	mprotect(READ|WRITE) then stores    caught at the next flush  caught at the next flush  tracked (the kernel keeps write-protection)
//	mprotect(READ) then a store         the guest's SIGSEGV: its handler runs (or it is killed), as untraced, in every mode
//	sigaltstack inside the aperture     frame pages opened before delivery, compared at flush    works
//	  (or a stack there)                  (insn and page)
//	read(2)/pread into the aperture     EFAULT                    full result from an open  full result, tracked
//	                                                              page, else EFAULT; caught
//	O_DIRECT read into the aperture     EFAULT (protected page)   caught: a flush stops     caught: the flush settles first (a
//	  (the device writes pinned pages)                            every guest thread, so    read returns once the device is done),
//	                                                              no read is in flight      or compares the page again at every
//	                                                                                        flush until one settles
//	munmap, other memory mapped at the  never protected nor emulated into: the tracer touches only mappings of
//	  aperture's address                  the aperture's file (its inode), mapping by mapping
//	AIO, io_uring into the aperture     LIMIT (page and uffd): the device may write pinned pages after any flush (after the
//	                                      call that pinned them returned); verify shows it
//
// The ptrace modes protect traced pages PROT_READ|PROT_EXEC: a fault on a
// page mapped otherwise read-only is the guest's own and is delivered to
// it (a guest that forbids executable mappings gets plain read-only pages,
// and its own read-only pages are then traced like the tracer's).
//
// verify compares every aperture's file with both device copies, so
// anything a row marked LIMIT loses is visible to an operator.
//
// The tracer runs in the hypervisor's process. Linux ties ptrace to the
// thread that attached, so all ptrace work runs on one locked OS thread;
// with Options.Pin in insn mode that thread and the guest's threads share
// one CPU (page mode never pins: it would run a multi-threaded guest's
// threads one at a time).
// Limits: the guest must run in a process group of its own (the tracer
// waits on that group only); the guest's job-control stops are not kept
// while it is traced.
package mmiotrace
