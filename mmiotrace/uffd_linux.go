package mmiotrace

import (
	"errors"
	"fmt"
	"runtime"
	"slices"

	"github.com/vgpuha/vgpuha/mmiotrace/internal/ptrace"
	"github.com/vgpuha/vgpuha/uffd"
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
// uffd, which the guest driver uses too): the hypervisor collects
// and re-arms the written pages with PAGEMAP_SCAN.
func ArmWriteTracking(mem []byte) (int, error) { return uffd.ArmWriteTracking(mem) }

// ErrNotArmed: in uffd mode, the guest has not (yet) armed write tracking
// on a region (ArmWriteTracking). The guest driver arms a region right
// after attaching it, before its next call.
var ErrNotArmed = errors.New("mmiotrace: the guest has not armed userfaultfd write tracking")

// scanWritten closes the regions' quiet pages (see Region.quiet): one
// PAGEMAP_SCAN per run write-protects those the guest wrote; they are
// returned as closed, for the flush to compare once more. Then a scan that
// changes nothing finds the open pages: those the guest wrote since they
// were write-protected (a write after the scan is caught by the next one).
// They stay open, compared at every flush until one finds them quiet.
func (t *Tracer) scanWritten(regions []*Region) (closed, open []dirtyPages, err error) {
	for _, r := range regions {
		if t.perWrite(r) || r.full {
			continue // a region sent whole now is scanned from the next flush (the guest arms it after attaching)
		}
		c := dirtyPages{r: r}
		for i := 0; i < len(r.quiet); i++ {
			if !r.quiet[i] {
				continue
			}
			j := i
			for j < len(r.quiet) && r.quiet[j] {
				r.quiet[j] = false
				c.pages = append(c.pages, uint64(j))
				j++
			}
			if err := t.scanRange(r, uint64(i), uint64(j), true, nil); err != nil {
				return nil, nil, err
			}
			i = j
		}
		o := dirtyPages{r: r}
		clear(r.dirty)
		err := t.scanRange(r, 0, uint64(len(r.dirty)), false, func(pg uint64) {
			r.dirty[pg] = true
			o.pages = append(o.pages, pg)
		})
		if err != nil {
			return nil, nil, err
		}
		if len(c.pages) > 0 {
			closed = append(closed, c)
		}
		if len(o.pages) > 0 {
			open = append(open, o)
		}
	}
	return closed, open, nil
}

// scanRange runs PAGEMAP_SCAN over pages [lo, hi) of r, write-protecting
// the written ones with wp, and calls written (if set) for each written
// page.
func (t *Tracer) scanRange(r *Region, lo, hi uint64, wp bool, written func(pg uint64)) error {
	// The kernel writes results through an address inside the ioctl's
	// argument, which the garbage collector cannot see: the buffer must be
	// on the heap (heap objects never move; a stack buffer may move with
	// its stack); scanPagemap keeps it alive across the call.
	if t.scanBuf == nil {
		t.scanBuf = make([]pageRegion, 64)
	}
	start, end := r.GuestAddr+lo*pageSize, r.GuestAddr+hi*pageSize
	for start < end {
		n, walkEnd, e := scanPagemap(t.pagemap.Fd(), start, end, wp, t.scanBuf)
		switch {
		case e == unix.ESRCH:
			return ErrGuestGone
		case e == unix.EPERM:
			return fmt.Errorf("%w: region at %#x", ErrNotArmed, r.GuestAddr)
		case e != 0:
			return fmt.Errorf("PAGEMAP_SCAN of the guest's region at %#x: %w", r.GuestAddr, e)
		}
		for _, pr := range t.scanBuf[:n] {
			for pg := pr.start; pg < pr.end && written != nil; pg += pageSize {
				written((pg - r.GuestAddr) / pageSize)
			}
		}
		if walkEnd <= start {
			break
		}
		start = walkEnd
	}
	return nil
}

// scanUnsettled returns the pages a uffd-mode flush compares: the open
// ones, those closed now, and those earlier flushes closed that a system
// call may still be writing. A device writing pages an O_DIRECT read
// pinned (or the kernel copying into pages it pinned, as a write to
// /proc/PID/mem does) writes through no page table: a closed page may be
// written after its last comparison. Its system call returns only once the
// device is done, so when settle finds every guest thread out of the calls
// in flight at the scan, comparing the pages after it catches everything;
// until then the closed pages are compared again at every flush (a flush
// closing few pages does not try: see settleAbove). Open pages need no
// settling: they are compared at the next flush anyway.
func (t *Tracer) scanUnsettled(regions []*Region) ([]dirtyPages, error) {
	closed, open, err := t.scanWritten(regions)
	if err != nil {
		return nil, err
	}
	leaving := mergePages(regions, t.unsettled, closed)
	t.unsettled = leaving
	n := 0
	for _, d := range leaving {
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
	return mergePages(regions, leaving, open), nil
}

// settleAbove: a flush settles only when more pages than this are open;
// comparing fewer again at the next flush costs less than looking at the
// guest's threads (a few microseconds per thread, more to stop one).
const settleAbove = 16

// settle reports whether every guest thread has left the system calls it
// was in when settle began, or was in none but a wait (ptrace.ThreadWatch):
// threads running or in another call are stopped through ptrace, where
// the tracer has it (a thread stops only in user space, once its call
// returned or was interrupted to be restarted), and resumed at once.
func (t *Tracer) settle() bool {
	if t.watch == nil {
		w, err := ptrace.NewThreadWatch(t.pid)
		if err != nil {
			return false
		}
		t.watch = w
	}
	busy, err := t.watch.InCalls(nil)
	// A thread seen running has often just made the call that brought the
	// flush, and waits a moment later: look again before stopping it.
	for look := 0; err == nil && len(busy) > 0 && look < settleLooks; look++ {
		runtime.Gosched()
		busy, err = t.watch.InCalls(busy)
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
	err = t.pt.Do(func(tid int) {
		var stopped []*ptrace.Thread
		stopped, all = t.pt.StopThreads(tid, busy)
		t.pt.ResumeOthers(stopped)
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
