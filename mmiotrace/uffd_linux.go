package mmiotrace

import (
	"errors"
	"fmt"
	"runtime"
	"slices"

	"github.com/vgpuha/vgpuha/internal/uffd"
	"golang.org/x/sys/unix"
)

// PAGEMAP_SCAN definitions (linux/fs.h; Linux 6.7 and later). golang.org/x/sys does not carry them.
// The ioctl numbers use the asm-generic encoding (x86, arm64, riscv).
const (
	pagemapScan       = 0xC0606610 // _IOWR('f', 16, struct pm_scan_arg)
	pmScanWPMatching  = 1 << 0
	pmScanCheckWPAsyn = 1 << 1
	pageIsWritten     = 1 << 1
)

type pmScanArg struct {
	size, flags, start, end, walkEnd, vec, vecLen, maxPages   uint64
	categoryInverted, categoryMask, categoryAnyof, returnMask uint64
}

type pageRegion struct{ start, end, categories uint64 }

// ArmWriteTracking is the guest side of uffd mode (see package
// internal/uffd, which the guest driver uses too): the hypervisor collects
// and re-arms the written pages with PAGEMAP_SCAN.
func ArmWriteTracking(mem []byte) (int, error) { return uffd.ArmWriteTracking(mem) }

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

// scanUnsettled returns the pages a uffd-mode flush compares: those the
// scan finds written, and those earlier flushes found that a system call
// may still be writing. A device writing pages an O_DIRECT read pinned
// (or the kernel copying into pages it pinned, as a write to
// /proc/PID/mem does) writes through no page table: the scan reports such
// a page once, when it was pinned, and the device may write it after the
// comparison. Its system call returns only once the device is done, so
// when settle finds every guest thread out of the calls in flight at the
// scan, comparing the pages after it catches everything; until then they
// are compared again at every flush (a flush with few open pages does not
// try: see settleAbove).
func (t *Tracer) scanUnsettled(regions []*Region) ([]dirtyPages, error) {
	scanned, err := t.scanWritten(regions)
	if err != nil {
		return nil, err
	}
	open := mergePages(regions, t.unsettled, scanned)
	t.unsettled = open
	n := 0
	for _, d := range open {
		n += len(d.pages)
	}
	if n > settleAbove && t.settle() {
		t.unsettled = nil
	}
	if t.unsettled != nil {
		t.mu.Lock()
		t.stats.Unsettled++
		t.mu.Unlock()
	}
	return open, nil
}

// settleAbove: a flush settles only when more pages than this are open;
// comparing fewer again at the next flush costs less than looking at the
// guest's threads (a few microseconds per thread, more to stop one).
const settleAbove = 16

// settle reports whether every guest thread has left the system calls it
// was in when settle began, or was in none but a wait (waitSyscalls):
// threads running or in another call are stopped through ptrace, where
// the tracer has it (a thread stops only in user space, once its call
// returned or was interrupted to be restarted), and resumed at once.
func (t *Tracer) settle() bool {
	if t.watch == nil {
		w, err := newThreadWatch(t.pid)
		if err != nil {
			return false
		}
		t.watch = w
	}
	busy, err := t.watch.inCalls(nil)
	// A thread seen running has often just made the call that brought the
	// flush, and waits a moment later: look again before stopping it.
	for look := 0; err == nil && len(busy) > 0 && look < settleLooks; look++ {
		runtime.Gosched()
		busy, err = t.watch.inCalls(busy)
	}
	if err != nil {
		return false
	}
	if len(busy) == 0 {
		return true
	}
	if t.pt == nil {
		return false
	}
	all := false
	err = t.pt.do(func(tid int) {
		var stopped []*thread
		stopped, all = t.pt.stopThreads(tid, busy)
		t.pt.resumeOthers(stopped)
	})
	t.mu.Lock()
	t.stats.SettleStops += uint64(len(busy))
	t.mu.Unlock()
	return err == nil && all
}

// settleLooks bounds how often settle looks again at threads it saw
// running or in a call before it stops them.
const settleLooks = 8

// mergePages joins page lists, per region, in page order without
// repeats; regions not in regions (removed) are dropped.
func mergePages(regions []*Region, lists ...[]dirtyPages) []dirtyPages {
	var out []dirtyPages
	for _, r := range regions {
		d := dirtyPages{r: r}
		for _, l := range lists {
			for _, e := range l {
				if e.r == r {
					d.pages = append(d.pages, e.pages...)
				}
			}
		}
		if len(d.pages) > 0 {
			slices.Sort(d.pages)
			d.pages = slices.Compact(d.pages)
			out = append(out, d)
		}
	}
	return out
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
