package uffd

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// userfaultfd definitions (linux/userfaultfd.h); golang.org/x/sys does not
// carry them. The ioctl numbers use the asm-generic _IOC encoding, the same
// on x86-64 and arm64.
const (
	userModeOnly = 1
	apiVersion   = 0xAA

	ioctlAPI      = 0xC018AA3F // _IOWR(0xAA, 0x3F, struct uffdio_api)
	ioctlRegister = 0xC020AA00 // _IOWR(0xAA, 0x00, struct uffdio_register)

	registerModeWP = 1 << 1

	featureWPHugetlbfsShmem = 1 << 12
	featureWPUnpopulated    = 1 << 13
	featureWPAsync          = 1 << 15
)

type apiArg struct{ api, features, ioctls uint64 }

type registerArg struct{ start, len, mode, ioctls uint64 }

// ArmWriteTracking registers mem (a shared mapping the caller's process
// writes) for userfaultfd's asynchronous write-protection, where the
// kernel resolves each first write to a write-protected page itself and
// only marks the page written, so no thread ever waits for a handler.
// Every page starts written (open): the tracer write-protects a page once
// it has compared it and seen it stop changing, so a guest writing the
// same pages again and again takes no fault for them. The returned
// descriptor must stay open while mem is tracked; closing it stops the
// tracking.
func ArmWriteTracking(mem []byte) (int, error) {
	if len(mem) == 0 {
		return -1, fmt.Errorf("userfaultfd: nothing to track")
	}
	fd, _, e := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK|userModeOnly, 0, 0)
	if e != 0 {
		return -1, fmt.Errorf("userfaultfd: %w", e)
	}
	ok := false
	defer func() {
		if !ok {
			unix.Close(int(fd))
		}
	}()
	api := apiArg{api: apiVersion, features: featureWPAsync | featureWPHugetlbfsShmem | featureWPUnpopulated}
	if err := ioctl(int(fd), ioctlAPI, unsafe.Pointer(&api)); err != nil {
		return -1, fmt.Errorf("userfaultfd: asynchronous write-protection is not available (Linux 6.7 or later): %w", err)
	}
	// Map every page writable first (no byte changes), so no first write
	// faults to map one. Best effort (Linux 5.14).
	unix.Madvise(mem, unix.MADV_POPULATE_WRITE)
	start, n := uint64(uintptr(unsafe.Pointer(&mem[0]))), uint64(len(mem))
	reg := registerArg{start: start, len: n, mode: registerModeWP}
	if err := ioctl(int(fd), ioctlRegister, unsafe.Pointer(&reg)); err != nil {
		return -1, fmt.Errorf("userfaultfd register: %w", err)
	}
	ok = true
	return int(fd), nil
}

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg)); e != 0 {
		return e
	}
	return nil
}
