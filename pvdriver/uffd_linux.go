package pvdriver

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The guest's half of the uffd aperture mode: the hypervisor collects and
// re-arms written pages with PAGEMAP_SCAN (package mmiotrace); the guest
// arms the tracking on its own mapping, since a userfaultfd belongs to the
// process whose memory it watches.

// userfaultfd definitions (linux/userfaultfd.h); golang.org/x/sys does not
// carry them. The ioctl numbers are the same on every Linux architecture
// that uses the generic _IOC encoding (x86-64, arm64).
const (
	uffdUserModeOnly = 1
	uffdAPI          = 0xAA

	uffdioAPI          = 0xC018AA3F // _IOWR(0xAA, 0x3F, struct uffdio_api)
	uffdioRegister     = 0xC020AA00 // _IOWR(0xAA, 0x00, struct uffdio_register)
	uffdioWriteProtect = 0xC018AA06 // _IOWR(0xAA, 0x06, struct uffdio_writeprotect)

	uffdRegisterModeWP     = 1 << 1
	uffdWriteProtectModeWP = 1 << 0

	uffdFeatureWPHugetlbfsShmem = 1 << 12
	uffdFeatureWPUnpopulated    = 1 << 13
	uffdFeatureWPAsync          = 1 << 15
)

type uffdioAPIArg struct{ api, features, ioctls uint64 }

type uffdioRegisterArg struct{ start, len, mode, ioctls uint64 }

type uffdioWriteProtectArg struct{ start, len, mode uint64 }

// armWriteTracking write-protects mem (the aperture's shared mapping)
// through a userfaultfd in asynchronous mode, where the kernel resolves
// each first write to a page itself and only marks the page written, so no
// thread ever waits for a handler. The returned descriptor must stay open
// while mem is tracked; closing it stops the tracking.
func armWriteTracking(mem []byte) (int, error) {
	fd, _, e := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK|uffdUserModeOnly, 0, 0)
	if e != 0 {
		return -1, fmt.Errorf("userfaultfd: %w", e)
	}
	ok := false
	defer func() {
		if !ok {
			unix.Close(int(fd))
		}
	}()
	api := uffdioAPIArg{api: uffdAPI, features: uffdFeatureWPAsync | uffdFeatureWPHugetlbfsShmem | uffdFeatureWPUnpopulated}
	if err := uffdIoctl(int(fd), uffdioAPI, unsafe.Pointer(&api)); err != nil {
		return -1, fmt.Errorf("userfaultfd: asynchronous write-protection is not available (Linux 6.7 or later): %w", err)
	}
	start, n := uint64(uintptr(unsafe.Pointer(&mem[0]))), uint64(len(mem))
	reg := uffdioRegisterArg{start: start, len: n, mode: uffdRegisterModeWP}
	if err := uffdIoctl(int(fd), uffdioRegister, unsafe.Pointer(&reg)); err != nil {
		return -1, fmt.Errorf("userfaultfd register: %w", err)
	}
	wp := uffdioWriteProtectArg{start: start, len: n, mode: uffdWriteProtectModeWP}
	if err := uffdIoctl(int(fd), uffdioWriteProtect, unsafe.Pointer(&wp)); err != nil {
		return -1, fmt.Errorf("userfaultfd write-protect: %w", err)
	}
	ok = true
	return int(fd), nil
}

func uffdIoctl(fd int, req uintptr, arg unsafe.Pointer) error {
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg)); e != 0 {
		return e
	}
	return nil
}
