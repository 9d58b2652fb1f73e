//go:build linux

package kmod

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// ioctlPtr passes arg to the device by address.
func ioctlPtr[T any](fd int, req uintptr, arg *T) error {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(unsafe.Pointer(arg)))
	if e != 0 {
		return e
	}
	return nil
}

// flushIoctl runs VG_IOC_FLUSH with words as the bitmap the module fills.
func flushIoctl(fd int, id uint32, words []uint64) error {
	f := vgFlush{ID: id, NPages: uint32(len(words) * 64)}
	if len(words) > 0 {
		f.Bitmap = uint64(uintptr(unsafe.Pointer(&words[0])))
	}
	return ioctlPtr(fd, iocFlush, &f)
}
