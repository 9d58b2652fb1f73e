//go:build linux

package mmiotrace

import (
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The userfaultfd and PAGEMAP_SCAN ioctls, whose arguments are pointers
// or carry addresses as numbers.

// ioctlPtr issues ioctl req on fd with a pointer to arg, which the kernel
// reads and may write back.
func ioctlPtr[T any](fd int, req uintptr, arg *T) error {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(unsafe.Pointer(arg)))
	if e != 0 {
		return e
	}
	return nil
}

// addrOf is the address of b's first byte, as the uffdio structures carry
// it. b must be memory that never moves (an mmap).
func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }

// scanPagemap runs one PAGEMAP_SCAN over [start, end) of the guest whose
// /proc/PID/pagemap is open as fd: it returns the written pages in vec[:n],
// write-protecting them again with wp, and where the walk stopped (it stops early
// when vec is full). vec must be on the heap: the kernel writes it by
// address.
func scanPagemap(fd uintptr, start, end uint64, wp bool, vec []pageRegion) (n int, walkEnd uint64, e unix.Errno) {
	flags := uint64(pmScanCheckWPAsyn)
	if wp {
		flags |= pmScanWPMatching
	}
	arg := pmScanArg{
		size: uint64(unsafe.Sizeof(pmScanArg{})), flags: flags,
		start: start, end: end, vec: uint64(uintptr(unsafe.Pointer(&vec[0]))), vecLen: uint64(len(vec)),
		categoryMask: pageIsWritten, returnMask: pageIsWritten,
	}
	r, _, e := unix.Syscall(unix.SYS_IOCTL, fd, pagemapScan, uintptr(unsafe.Pointer(&arg)))
	runtime.KeepAlive(vec)
	return int(r), arg.walkEnd, e
}
