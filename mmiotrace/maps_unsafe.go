//go:build linux

package mmiotrace

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// PROCMAP_QUERY (linux/fs.h, Linux 6.11 and later): one mapping of a
// process by address, from an ioctl on its /proc/PID/maps. golang.org/x/sys
// does not carry it; the number uses the asm-generic encoding.
const (
	procmapQuery          = 0xC0686611 // _IOWR('f', 17, struct procmap_query)
	procmapCoveringOrNext = 1 << 4     // PROCMAP_QUERY_COVERING_OR_NEXT_VMA
)

type procmapQueryArg struct {
	size, queryFlags, queryAddr, vmaStart, vmaEnd, vmaFlags, vmaPageSize, vmaOffset, inode uint64
	devMajor, devMinor, vmaNameSize, buildIDSize                                           uint32
	vmaNameAddr, buildIDAddr                                                               uint64
}

// queryVMA returns the first mapping of the process whose maps file is fd
// that ends above addr: its bounds, PROCMAP_QUERY_VMA_* flags and file.
// ENOENT: none; ENOTTY: the kernel has no PROCMAP_QUERY.
func queryVMA(fd uintptr, addr uint64) (vma, unix.Errno) {
	q := &procmapQueryArg{queryFlags: procmapCoveringOrNext, queryAddr: addr}
	q.size = uint64(unsafe.Sizeof(*q))
	_, _, e := unix.Syscall(unix.SYS_IOCTL, fd, procmapQuery, uintptr(unsafe.Pointer(q)))
	return vma{start: q.vmaStart, end: q.vmaEnd, flags: q.vmaFlags, ino: q.inode}, e
}
