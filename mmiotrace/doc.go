// Package mmiotrace catches a guest process's direct writes to memory it
// shares with the hypervisor (apertures: mapped device memory), so they can
// be replicated like calls. It owns the tracing mechanisms (the x86
// store decoder is package x86store); it never decides what a write
// means or where it goes (the hypervisor turns Flush output into log
// records), and it never changes guest memory outside the regions it was
// given.
//
// It is the one place that reaches into a guest process — ptrace,
// userfaultfd, pidfd_getfd, SO_PEERCRED, /proc/PID/{maps,mem,pagemap} —
// so the hypervisor has no system calls of its own (it takes a guest's
// memory with MapGuestFile): the tracer's guarantees rest on how that
// memory was taken (a sealed file, mapped writable once by the guest).
// unsafe appears only in *_unsafe.go (pointers handed to the kernel);
// x86-64 registers and system-call injection only in *_amd64.go, with
// stubs elsewhere that return ErrUnsupportedArch. The decoder is portable
// Go in package x86store: it decodes x86-64 bytes on any host.
//
// Modes (measured costs in docs/PERFORMANCE.md):
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
//   - page: the first write to a protected page faults; the tracer
//     unprotects that page and every page after it to the region's end, and
//     marks them open (the open pages are always the end of a run, so a
//     system call writing from an open page never meets a protected one).
//     Every flush compares the open pages with what it last sent and sends
//     the ranges that changed. An open page stays open while it keeps
//     changing; once a flush finds it unchanged (quiet), the next flush
//     protects it again — the quiet pages at the start of each open run,
//     by an mprotect injected into a stopped guest thread — and compares
//     it once more. A flush with nothing to protect does not stop the
//     guest, and a guest rewriting the same pages takes no fault per flush.
//   - auto: insn mode per write, with a choice per page of a memory
//     region made from the faults the tracer takes there: a page that
//     takes a streak of write faults within one flush interval (more than
//     four), or changed more than four words in the last, is opened until
//     the next flush, which compares it after the records of its stores
//     before; doorbell-like pages stay per write (auto_linux.go).
//   - uffd: page tracking by the kernel alone: the guest driver registers
//     its aperture for userfaultfd's asynchronous write-protection
//     (ArmWriteTracking; every page starts open), and a flush finds the
//     open pages — written since they were write-protected — with a
//     PAGEMAP_SCAN ioctl on /proc/PID/pagemap that changes nothing, and
//     compares them. As in page mode, a page stays open while it keeps
//     changing; the next flush after one finds it quiet write-protects it
//     (PAGEMAP_SCAN) and compares it once more. No fault ever leaves the
//     kernel. Before pages stop being compared (they were write-protected)
//     the flush settles: every guest thread is seen
//     (/proc/PID/task/TID/syscall) waiting — futex, poll, epoll, sleep,
//     wait — or in no system call, and the others (running, or in a call
//     that may pin memory: read, ioctl…) are stopped for a moment through
//     ptrace, which uffd mode attaches where it can (not the tracer's own
//     process, x86-64, permission). A page whose flush did not settle is
//     compared again at every flush until one does (a flush closing at
//     most 16 such pages does not try: comparing them costs less).
//   - kmod, kmod-page, kmod-auto: the vgpuha_mmio kernel module traces the
//     stores (kmod/module): per store (a fault, the store under the trap
//     flag, a debug trap that records its bytes; no process switch), per
//     page for memory regions in kmod-page, or per store until a page takes
//     a streak within a flush interval in kmod-auto. kmod_linux.go says how the guest's
//     mapping becomes the module's, what each case does, and how a node
//     the guest's session resumes on takes the module's apertures over.
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
//	O_DIRECT read into the aperture     EFAULT (protected page)   caught: open pages are    caught: open pages are compared at
//	  (the device writes pinned pages)                            compared at every flush;  every flush; closing them settles
//	                                                              a flush closing pages     first (a read returns once the device
//	                                                              stops every guest thread  is done), or compares them again at
//	                                                              first, so no read is in   every flush until one settles
//	                                                              flight
//	munmap, other memory mapped at the  never protected nor emulated into: the tracer touches only mappings of
//	  aperture's address                  the aperture's file (its inode), mapping by mapping
//	AIO, io_uring into the aperture     LIMIT (page and uffd): the device may write pinned pages after any flush (after the
//	                                      call that pinned them returned); verify shows it
//
// auto mode is insn on a protected page and page mode on an open one,
// but opens one page at a time: a system call writing from an open page
// into a protected one returns a short count (from a protected one,
// EFAULT).
//
// The ptrace modes protect traced pages PROT_READ|PROT_EXEC: a fault on a
// page mapped otherwise read-only is the guest's own and is delivered to
// it (a guest that forbids executable mappings gets plain read-only pages,
// and its own read-only pages are then traced like the tracer's).
//
// verify compares every aperture's file with both device copies (a
// checksum; with --apertures byte by byte, per node), so anything a row
// marked LIMIT loses is visible to an operator.
//
// The tracer runs in the hypervisor's process. Linux ties ptrace to the
// thread that attached, so all ptrace work runs on one locked OS thread;
// with Options.Pin in insn and auto mode that thread and the guest's threads share
// one CPU (page mode never pins: it would run a multi-threaded guest's
// threads one at a time).
// Limits: the guest must run in a process group of its own (the tracer
// waits on that group only); the guest's job-control stops are not kept
// while it is traced.
package mmiotrace
