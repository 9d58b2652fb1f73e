package mmiotrace

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// userfaultfd and PAGEMAP_SCAN definitions (linux/userfaultfd.h,
// linux/fs.h; Linux 6.7 and later). golang.org/x/sys does not carry them.
// The ioctl numbers use the asm-generic encoding (x86, arm64, riscv).
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

	pagemapScan       = 0xC0606610 // _IOWR('f', 16, struct pm_scan_arg)
	pmScanWPMatching  = 1 << 0
	pmScanCheckWPAsyn = 1 << 1
	pageIsWritten     = 1 << 1
)

type uffdioAPIArg struct{ api, features, ioctls uint64 }

type uffdioRegisterArg struct {
	start, len, mode, ioctls uint64
}

type uffdioWriteProtectArg struct{ start, len, mode uint64 }

type pmScanArg struct {
	size, flags, start, end, walkEnd, vec, vecLen, maxPages   uint64
	categoryInverted, categoryMask, categoryAnyof, returnMask uint64
}

type pageRegion struct{ start, end, categories uint64 }

// ArmWriteTracking is the guest side of uffd mode: it write-protects mem
// (a shared mapping the guest writes) through a userfaultfd in
// asynchronous mode, where the kernel resolves each first write to a page
// itself and only marks the page written, so no thread ever waits for a
// handler. The hypervisor collects and re-arms the written pages with
// PAGEMAP_SCAN. The returned descriptor must stay open while mem is
// tracked; closing it stops the tracking.
func ArmWriteTracking(mem []byte) (int, error) {
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
	if err := ioctlPtr(int(fd), uffdioAPI, &api); err != nil {
		return -1, fmt.Errorf("userfaultfd: asynchronous write-protection is not available (Linux 6.7 or later): %w", err)
	}
	start, n := addrOf(mem), uint64(len(mem))
	reg := uffdioRegisterArg{start: start, len: n, mode: uffdRegisterModeWP}
	if err := ioctlPtr(int(fd), uffdioRegister, &reg); err != nil {
		return -1, fmt.Errorf("userfaultfd register: %w", err)
	}
	wp := uffdioWriteProtectArg{start: start, len: n, mode: uffdWriteProtectModeWP}
	if err := ioctlPtr(int(fd), uffdioWriteProtect, &wp); err != nil {
		return -1, fmt.Errorf("userfaultfd write-protect: %w", err)
	}
	ok = true
	return int(fd), nil
}

// ErrNotArmed: in uffd mode, the guest has not (yet) armed write tracking
// on a region (ArmWriteTracking). The guest driver arms a region right
// after attaching it, before its next call.
var ErrNotArmed = errors.New("mmiotrace: the guest has not armed userfaultfd write tracking")

// scanWritten asks the kernel which pages of the regions the guest wrote
// since the last scan, write-protecting them again in the same call, so a
// write after the scan is caught by the next one.
func (t *Tracer) scanWritten(regions []*Region) ([]dirtyPages, error) {
	var out []dirtyPages
	// The kernel writes results through an address inside the ioctl's
	// argument, which the garbage collector cannot see: the buffer must be
	// on the heap (heap objects never move; a stack buffer may move with
	// its stack); scanPagemap keeps it alive across the call.
	if t.scanBuf == nil {
		t.scanBuf = make([]pageRegion, 64)
	}
	vec := t.scanBuf
	for _, r := range regions {
		if t.perWrite(r) || r.full {
			continue // a region sent whole now is scanned from the next flush (the guest arms it after attaching)
		}
		d := dirtyPages{r: r}
		start, end := r.GuestAddr, r.GuestAddr+uint64(len(r.Mem))
		for start < end {
			n, walkEnd, e := scanPagemap(t.pagemap.Fd(), start, end, vec)
			switch {
			case e == unix.ESRCH:
				return nil, ErrGuestGone
			case e == unix.EPERM:
				return nil, fmt.Errorf("%w: region at %#x", ErrNotArmed, r.GuestAddr)
			case e != 0:
				return nil, fmt.Errorf("PAGEMAP_SCAN of the guest's region at %#x: %w", r.GuestAddr, e)
			}
			for _, pr := range vec[:n] {
				for pg := pr.start; pg < pr.end; pg += pageSize {
					d.pages = append(d.pages, (pg-r.GuestAddr)/pageSize)
				}
			}
			if walkEnd <= start {
				break
			}
			start = walkEnd
		}
		if len(d.pages) > 0 {
			out = append(out, d)
		}
	}
	return out, nil
}

// UffdAvailable reports whether this kernel offers what uffd mode needs
// (userfaultfd asynchronous write-protection on shared memory, Linux 6.7+),
// by arming and disarming a scratch mapping.
func UffdAvailable() error {
	mem, err := unix.Mmap(-1, 0, pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		return err
	}
	defer unix.Munmap(mem)
	fd, err := ArmWriteTracking(mem)
	if err != nil {
		return err
	}
	return unix.Close(fd)
}
