package mmiotrace

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/vgpuha/vgpuha/mmiotrace/internal/ptrace"
	"github.com/vgpuha/vgpuha/mmiotrace/x86store"
)

const pageSize = 4096

// protTraced is the protection the ptrace modes give the pages they trace:
// readable and executable, so stores fault, and a page a guest made
// read-only itself (never executable: no guest runs code from an
// aperture) can be told from the tracer's by its mapping. A store there
// is the guest's own fault, delivered to it. Where the guest forbids
// executable mappings (MDWE, a seccomp filter) the tracer falls back to
// plain read-only and cannot tell them apart.
const protTraced = unix.PROT_READ | unix.PROT_EXEC

// Region is memory the guest maps and writes directly (an aperture).
type Region struct {
	GuestAddr uint64 // where the guest process maps it (page-aligned)
	Mem       []byte // the hypervisor's mapping of the same memory
	Kind      Kind

	readOnly bool   // Mem cannot be written here (MapGuestFile): stores are stepped, never emulated
	ino      uint64 // the file's inode (MapGuestFile), 0 if unknown: only its mappings are the region's
	// kmodViews: the guest's mappings of the kernel module of r's size
	// (MapGuestFile found no mapping of the file: a kmod mode traced it
	// before); AddRegion adopts the one over r's file.
	kmodViews []kmodView

	shadow []byte // contents as of the last flush, for sending changed ranges only
	// dirty: pages the guest may write without the tracer seeing it,
	// compared at every flush: page mode's unprotected pages; uffd mode's
	// pages the last scan found written (not write-protected).
	dirty []bool
	// quiet: open pages (dirty, page-batched) that the last flush compared
	// and found unchanged. A page stays open while it keeps changing: the
	// next flush closes a quiet page (protects it, or write-protects it in
	// uffd mode) and then compares it once more, so a write made after the
	// last comparison is caught either way. A guest writing the same pages
	// again and again takes no fault per page per flush.
	quiet []bool
	full  bool       // the next flush sends the whole region (just added)
	auto  *autoState // auto mode (memory regions): each page's faults this interval
}

func (r *Region) contains(addr, n uint64) bool {
	return addr >= r.GuestAddr && n <= uint64(len(r.Mem)) && addr-r.GuestAddr <= uint64(len(r.Mem))-n
}

// Options configure a Tracer.
type Options struct {
	Mode Mode
	// Pin puts the tracer thread and every guest thread on one CPU in insn
	// and auto mode: a fault then wakes the tracer without crossing CPUs (3–4×
	// cheaper per traced write on the machines we measured), and the
	// guest's threads, each stopped at every store, run one at a time
	// anyway. Page mode never pins: its faults are rare, and a guest whose
	// threads share one CPU runs that many times slower.
	Pin bool
	// StepOnly single-steps every store instead of emulating it: the
	// unprotect, step, re-protect path alone, for measurement.
	StepOnly bool
	Metrics  *Metrics // nil: none
}

// Stats counts what a tracer did.
type Stats struct {
	Faults         uint64 // write faults the tracer handled
	Emulated       uint64 // stores decoded and emulated
	Stepped        uint64 // decoded read-modify-writes single-stepped
	Undecodable    uint64 // stores the decoder could not describe: stepped, page compared
	Records        uint64 // writes or changed ranges handed to Flush's caller
	Bytes          uint64 // bytes in those records
	Flushes        uint64
	DirtyPages     uint64 // pages found written at flushes (page, uffd)
	GuestOpened    uint64 // protected pages found writable at flushes: the guest's own mprotect (compared, protected again)
	GuestFaults    uint64 // faults on pages the guest protected itself, delivered to it
	Unsettled      uint64 // uffd mode: flushes after which written pages stay open (a guest thread may be in a system call writing them)
	SettleStops    uint64 // uffd mode: guest threads stopped to settle a flush (they were running or in a call that may pin memory)
	Streaks        uint64 // auto mode: pages opened until the next flush after a streak of write faults
	PinnedCPU      int    // -1: not pinned
	PtraceAttached bool
}

// Tracer catches one guest process's writes to its regions.
type Tracer struct {
	pid  int
	opts Options

	mu      sync.Mutex
	regions []*Region
	writes  []write // per-write records since the last flush, in program order
	stats   Stats
	pt      *ptrace.Process // nil until a region needs ptrace
	prot    int             // with pt: the protection of traced pages, protTraced or PROT_READ
	maps    *os.File        // the guest's /proc/PID/maps, with pt: finds pages the guest opened itself
	pagemap *os.File        // uffd mode
	scanBuf []pageRegion    // uffd mode: PAGEMAP_SCAN results (heap: the kernel writes it by address)
	// uffd mode: pages found written that a system call in flight may
	// still be writing (see settle), compared at every flush until settled.
	unsettled   []dirtyPages
	triedPtrace bool                // uffd mode: startPtrace was tried for settle (it may fail: settle works without)
	watch       *ptrace.ThreadWatch // uffd mode: the guest's threads, for settle
	km          *kmodState          // kmod modes, from the first region on
}

type write struct {
	r    *Region
	off  uint64
	data []byte
}

// Attach prepares to trace process pid. Nothing is attached until the first
// region is added.
func Attach(pid int, opts Options) *Tracer {
	return &Tracer{pid: pid, opts: opts, stats: Stats{PinnedCPU: -1}}
}

// perWrite reports whether writes to r are traced one by one (insn and
// kmod modes, the auto modes' pages until they streak, and register
// regions in every tracing mode).
func (t *Tracer) perWrite(r *Region) bool {
	switch t.opts.Mode {
	case ModeInsn, ModeAuto, ModeKmod, ModeKmodAuto: // the auto modes: per write until a page streaks
		return true
	}
	return t.opts.Mode != ModeOff && r.Kind == KindRegister
}

// usesPtrace reports whether r is protected and handled through ptrace.
func (t *Tracer) usesPtrace(r *Region) bool {
	return !t.usesKmod() && (t.perWrite(r) || t.opts.Mode == ModePage)
}

// AddRegion starts tracing writes to r. The guest must already map it. The
// next Flush reports the whole region.
func (t *Tracer) AddRegion(r *Region) error {
	if r.GuestAddr%pageSize != 0 || len(r.Mem) == 0 || len(r.Mem)%pageSize != 0 {
		return fmt.Errorf("region at %#x of %d bytes is not page-aligned", r.GuestAddr, len(r.Mem))
	}
	t.mu.Lock()
	for _, o := range t.regions {
		if r.GuestAddr < o.GuestAddr+uint64(len(o.Mem)) && o.GuestAddr < r.GuestAddr+uint64(len(r.Mem)) {
			t.mu.Unlock()
			return fmt.Errorf("region at %#x overlaps the traced region at %#x", r.GuestAddr, o.GuestAddr)
		}
	}
	t.mu.Unlock()
	r.shadow = make([]byte, len(r.Mem))
	r.dirty = make([]bool, len(r.Mem)/pageSize)
	r.quiet = make([]bool, len(r.Mem)/pageSize)
	r.full = true
	switch {
	case len(r.kmodViews) > 0 && !t.usesKmod():
		return fmt.Errorf("the guest's aperture at %#x is the kernel module's mapping (a kmod mode traced it before): this node traces in %s mode, use a kmod mode", r.GuestAddr, t.opts.Mode)
	case t.usesKmod():
		if err := t.addKmodRegion(r); err != nil {
			return err
		}
	case t.usesPtrace(r):
		if err := t.startPtrace(); err != nil {
			return err
		}
		if err := t.protectNew(r); err != nil {
			return err
		}
	case t.opts.Mode == ModeUffd:
		if t.pagemap == nil {
			f, err := os.OpenFile(fmt.Sprintf("/proc/%d/pagemap", t.pid), os.O_RDONLY, 0)
			if err != nil {
				return fmt.Errorf("opening the guest's pagemap: %w", err)
			}
			t.pagemap = f
		}
		if !t.triedPtrace {
			// Best effort (not this process, x86-64, permission): without
			// it settle waits for the guest's threads to be seen waiting.
			t.triedPtrace = true
			t.startPtrace()
		}
	}
	t.mu.Lock()
	t.regions = append(t.regions, r)
	t.mu.Unlock()
	return nil
}

// protectNew write-protects a region being added, choosing the traced
// pages' protection on the first one (see protTraced).
func (t *Tracer) protectNew(r *Region) error {
	var perr error
	err := t.pt.Do(func(tid int) {
		if t.prot == 0 {
			t.prot = protTraced
			perr = t.pt.Mprotect(tid, r.GuestAddr, uint64(len(r.Mem)), t.prot)
			if errors.Is(perr, unix.EACCES) || errors.Is(perr, unix.EPERM) {
				t.prot = unix.PROT_READ
			}
		}
		if t.prot != protTraced || perr != nil {
			perr = t.pt.Mprotect(tid, r.GuestAddr, uint64(len(r.Mem)), t.prot)
		}
	})
	return errors.Join(err, perr)
}

// ErrSelfTrace: a region that needs ptrace belongs to the tracer's own
// process, which cannot trace itself (uffd memory regions can).
var ErrSelfTrace = errors.New("mmiotrace: a process cannot trace itself with ptrace")

func (t *Tracer) startPtrace() error {
	if t.pt != nil {
		return nil
	}
	if t.pid == os.Getpid() {
		return fmt.Errorf("%w (%s mode)", ErrSelfTrace, t.opts.Mode)
	}
	if err := ptraceArchErr(t.opts.Mode); err != nil {
		return err
	}
	cpu := -1
	if t.opts.Pin && (t.opts.Mode == ModeInsn || t.opts.Mode == ModeAuto) {
		cpu = runtime.NumCPU() - 1
		var set unix.CPUSet
		if unix.SchedGetaffinity(0, &set) == nil {
			for c := 0; c < 1024; c++ {
				if set.IsSet(c) {
					cpu = c // the last CPU this process may use
				}
			}
		}
	}
	maps, err := os.Open(fmt.Sprintf("/proc/%d/maps", t.pid))
	if err != nil {
		return fmt.Errorf("opening the guest's mappings: %w", err)
	}
	pt, err := ptrace.Start(t.pid, cpu, t.onFault, t.onSignal)
	if err != nil {
		maps.Close()
		return err
	}
	t.mu.Lock()
	t.pt, t.maps = pt, maps
	t.stats.PinnedCPU, t.stats.PtraceAttached = cpu, true
	t.mu.Unlock()
	return nil
}

// RemoveRegion stops tracing r and unprotects it in the guest (if the guest
// still maps it). Writes not yet flushed are dropped: flush first.
func (t *Tracer) RemoveRegion(r *Region) {
	t.mu.Lock()
	for i, o := range t.regions {
		if o == r {
			t.regions = append(t.regions[:i], t.regions[i+1:]...)
			break
		}
	}
	kept := t.writes[:0]
	for _, w := range t.writes {
		if w.r != r {
			kept = append(kept, w)
		}
	}
	t.writes = kept
	pt := t.pt
	t.mu.Unlock()
	if t.km != nil {
		t.removeKmodRegion(r)
	}
	if pt != nil && t.usesPtrace(r) {
		pt.Do(func(tid int) {
			// The pages the tracer protected; those the guest protected
			// itself keep its protection.
			match := r.mappedAnd(tracerProtected)
			if t.prot != protTraced {
				match = r.mapped
			}
			vmaRanges(t.maps, r.GuestAddr, r.GuestAddr+uint64(len(r.Mem)), match, func(lo, hi uint64) {
				pt.Mprotect(tid, lo, hi-lo, unix.PROT_READ|unix.PROT_WRITE)
			})
		})
	}
}

// Resend makes the next Flush report r whole, as when it was added (a
// repair: whatever the device copies hold, they end equal to r.Mem).
func (t *Tracer) Resend(r *Region) {
	t.mu.Lock()
	r.full = true
	t.mu.Unlock()
}

// Close stops tracing: regions are unprotected and the guest runs on
// untraced. In the kmod modes the module's apertures are left to the
// guest, which stores on into its memory files; a tracer that attaches a
// file again adopts its aperture (kmod_linux.go).
func (t *Tracer) Close() error {
	t.leaveKmod()
	t.mu.Lock()
	regions := append([]*Region(nil), t.regions...)
	t.mu.Unlock()
	for _, r := range regions {
		t.RemoveRegion(r)
	}
	var err error
	if t.pt != nil {
		err = t.pt.Close()
	}
	if t.pagemap != nil {
		t.pagemap.Close()
	}
	if t.watch != nil {
		t.watch.Close()
	}
	if t.maps != nil {
		t.maps.Close()
	}
	if t.km != nil {
		t.km.dev.Close()
	}
	return err
}

// Stats returns the counts so far.
func (t *Tracer) Stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stats
}

// regionAt is the region containing guest address addr.
// Precondition: t.mu must be locked.
func (t *Tracer) regionAt(addr uint64) *Region {
	for _, r := range t.regions {
		if r.contains(addr, 1) {
			return r
		}
	}
	return nil
}

// onFault runs on the tracer thread with thread tid stopped at a write
// fault on addr.
func (t *Tracer) onFault(tid int, addr uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.regionAt(addr)
	if r == nil {
		return false
	}
	if !t.usesPtrace(r) { // uffd mode: the kernel resolves its own faults; this is the guest's protection
		t.stats.GuestFaults++
		return false
	}
	vmaEnd, open, ours := t.ownFault(r, addr)
	if !ours {
		t.stats.GuestFaults++
		return false
	}
	t.stats.Faults++
	t.opts.Metrics.fault(t.opts.Mode)
	if t.autoPages(r) && t.autoOpen(tid, r, addr, vmaEnd, open) {
		return true
	}
	if !t.perWrite(r) {
		// Page mode: let the guest write this page and every page after
		// it, up to the region's end (or a page it protected itself),
		// until the next flush. So the open pages are always the end of
		// the region: a system call writing into the region from an open
		// page never meets a protected one (it would return a short
		// count), and one starting at a protected page fails at once
		// (EFAULT). Writes run in streaks; a page opened but not written
		// costs only a comparison at the flush, a fault costs an injected
		// system call.
		first := (addr - r.GuestAddr) / pageSize
		if open && r.dirty[first] {
			// Another thread's fault opened the page meanwhile (with the
			// rest of the region): the store just runs again.
			return true
		}
		end := uint64(len(r.dirty))
		if vmaEnd < r.GuestAddr+uint64(len(r.Mem)) { // vmaEnd > addr
			end = (vmaEnd - r.GuestAddr + pageSize - 1) / pageSize
		}
		if err := t.pt.Mprotect(tid, r.GuestAddr+first*pageSize, (end-first)*pageSize, unix.PROT_READ|unix.PROT_WRITE); err != nil {
			return false
		}
		for p := first; p < end; p++ {
			r.dirty[p] = true
		}
		return true
	}
	return t.traceWrite(tid, r, addr)
}

// sigFrameMax bounds what the kernel writes below a stack pointer to
// deliver a signal: the frame with the largest XSAVE state (AMX tiles),
// and the 128-byte red zone.
const sigFrameMax = 16 << 10

// onSignal runs on the tracer thread before a signal is delivered to
// stopped thread tid. Where the kernel will write the signal frame into a
// region (a sigaltstack there, or a thread already running on a stack
// there), it opens those pages until the next flush, which compares them:
// the kernel cannot write a protected page (it would kill the guest), and
// its writes never fault to the tracer.
func (t *Tracer) onSignal(tid int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !slices.ContainsFunc(t.regions, t.usesPtrace) {
		return // uffd mode with memory regions only: nothing of the tracer's is protected
	}
	regs, _, err := t.pt.Regs(tid, false)
	if err != nil {
		return
	}
	sp := regs.GPR[4]
	lo, hi := sp-sigFrameMax, sp // on a stack in a region: the frame goes below it
	if t.regionAt(sp-1) == nil {
		scratch := (sp - 256) &^ 15 // below the red zone
		if t.regionAt(scratch) != nil {
			return
		}
		alo, ahi, ok := t.pt.AltStack(tid, scratch)
		if !ok {
			return
		}
		lo, hi = max(alo, ahi-min(ahi, sigFrameMax)), ahi // frames go at its top
	}
	for _, r := range t.regions {
		if !t.usesPtrace(r) {
			continue // uffd mode: the kernel writes a frame there as any store, tracked
		}
		if r.contains(lo, 1) || r.contains(hi-1, 1) || (lo < r.GuestAddr && hi > r.GuestAddr) {
			t.openPages(tid, r, max(lo, r.GuestAddr), min(hi, r.GuestAddr+uint64(len(r.Mem))))
		}
	}
}

// openPages makes the pages of r covering [lo, hi) writable until the next
// flush (they are marked dirty), leaving those the guest protected itself.
// Precondition: t.mu must be locked.
func (t *Tracer) openPages(tid int, r *Region, lo, hi uint64) {
	lo, hi = lo&^(pageSize-1), (hi+pageSize-1)&^(pageSize-1)
	open := func(lo, hi uint64) {
		if t.pt.Mprotect(tid, lo, hi-lo, unix.PROT_READ|unix.PROT_WRITE) != nil {
			return
		}
		for pg := (lo - r.GuestAddr) / pageSize; pg < (hi-r.GuestAddr)/pageSize; pg++ {
			r.dirty[pg] = true
		}
	}
	match := r.mappedAnd(tracerProtected)
	if t.prot != protTraced {
		match = r.mapped
	}
	vmaRanges(t.maps, lo, hi, match, open)
}

// ownFault reports whether a write fault at addr, in region r, is the
// tracer's (the page of r's file has protTraced, or is writable again:
// opened meanwhile) rather than the guest's own protection or another
// mapping at that address, where the mapping ends, and whether the page
// is writable now.
// Precondition: t.mu must be locked.
func (t *Tracer) ownFault(r *Region, addr uint64) (end uint64, open, ours bool) {
	v, ok, err := vmaAt(t.maps, addr)
	if err != nil || !ok || v.start > addr {
		return ^uint64(0), false, true // cannot tell: the tracer's, as it would be without the marker
	}
	if !r.mapped(v) {
		return v.end, false, false
	}
	if t.prot != protTraced {
		return v.end, writable(v), true
	}
	return v.end, writable(v), tracerProtected(v) || writable(v)
}

func (t *Tracer) ownFaultAt(r *Region, addr uint64) bool {
	_, _, ours := t.ownFault(r, addr)
	return ours
}

// traceWrite records the store that faulted at addr: emulated when the
// decoder can, else single-stepped with the page unprotected.
// Precondition: t.mu must be locked.
func (t *Tracer) traceWrite(tid int, r *Region, addr uint64) bool {
	regs, raw, err := t.pt.Regs(tid, false)
	if err != nil {
		return false
	}
	code := make([]byte, 16)
	n, _ := t.pt.Mem.ReadAt(code, int64(regs.RIP))
	a, derr := x86store.Decode(code[:n])
	if derr == nil && a.Emulated() && !t.opts.StepOnly && !r.readOnly {
		if a.VectorSource() {
			if err := ptrace.ReadVectors(tid, regs); err != nil {
				return false
			}
		}
		dst, size := a.Target(regs)
		if r.contains(dst, size) {
			if st, err := a.Emulate(regs, t.read); err == nil {
				off := st.Addr - r.GuestAddr
				copy(r.Mem[off:], st.Data)
				if err := ptrace.SetRegs(tid, regs, raw); err != nil {
					return false
				}
				t.record(r, off, st.Data)
				t.stats.Emulated++
				return true
			}
		}
	}
	if derr == nil && a.Bounded() && !a.StringOp() {
		// A read-modify-write of a proven range: the operand's bytes after
		// the step are the store, recorded even where the value is
		// unchanged (a doorbell write counts).
		dst, size := a.Target(regs)
		if _, err := t.stepUnprotected(tid, addr); err != nil {
			return err == ErrGuestGone
		}
		t.recordRange(dst, size)
		t.stats.Stepped++
		t.opts.Metrics.fallback(t.opts.Mode, "read_modify_write")
		return true
	}
	// Unbounded, undecodable or a string op the emulator refused (one
	// step is one element): step, then record exactly the bytes that
	// changed on every page the step touched.
	snaps, err := t.stepUnprotected(tid, addr)
	if err != nil {
		return err == ErrGuestGone
	}
	for _, sn := range snaps {
		after := sn.r.Mem[sn.off : sn.off+pageSize]
		diffRanges(sn.before, after, func(off, n int) {
			t.record(sn.r, sn.off+uint64(off), append([]byte(nil), after[off:off+n]...))
		})
	}
	t.stats.Undecodable++
	t.opts.Metrics.fallback(t.opts.Mode, "undecodable")
	return true
}

// read is guest memory as the emulator sees it: regions from the
// hypervisor's mapping, the rest from /proc/PID/mem.
// Precondition: t.mu must be locked.
func (t *Tracer) read(addr uint64, b []byte) error {
	for _, r := range t.regions {
		if r.contains(addr, uint64(len(b))) {
			copy(b, r.Mem[addr-r.GuestAddr:])
			return nil
		}
	}
	return t.pt.ReadGuest(addr, b)
}

// pageSnap is a traced page as it was before a single-step made it
// writable.
type pageSnap struct {
	r      *Region
	off    uint64 // page offset in r
	before []byte
}

// maxStepPages bounds the pages one stepped instruction may touch: an
// AVX-512 scatter stores 16 elements, each maybe straddling two pages.
const maxStepPages = 64

// stepUnprotected single-steps the faulting instruction with the page it
// faulted on writable and every other guest thread stopped, so no other
// thread writes the page untraced meanwhile. Pages the step faults on next
// (a store straddling a page boundary, a far bit, a scatter's elements)
// are unprotected too. Each page is copied before it is unprotected, so
// the caller can tell exactly what the instruction changed.
// Precondition: t.mu must be locked.
func (t *Tracer) stepUnprotected(tid int, addr uint64) ([]pageSnap, error) {
	pt := t.pt
	others, _ := pt.StopOthers(tid)
	defer pt.ResumeOthers(others)
	var snaps []pageSnap
	defer func() {
		for _, sn := range snaps {
			pt.Mprotect(tid, sn.r.GuestAddr+sn.off, pageSize, t.prot)
		}
	}()
	open := func(at uint64) error {
		r := t.regionAt(at)
		off := (at - r.GuestAddr) &^ (pageSize - 1)
		snaps = append(snaps, pageSnap{r: r, off: off, before: append([]byte(nil), r.Mem[off:off+pageSize]...)})
		return pt.Mprotect(tid, r.GuestAddr+off, pageSize, unix.PROT_READ|unix.PROT_WRITE)
	}
	if err := open(addr); err != nil {
		return snaps, err
	}
	for range maxStepPages {
		err := pt.SingleStep(tid)
		var sf *ptrace.StepFault
		if !errors.As(err, &sf) {
			return snaps, err
		}
		if r := t.regionAt(sf.Addr); r == nil || !t.ownFaultAt(r, sf.Addr) {
			// A genuine fault outside the regions, or on a page the guest
			// protected itself: the guest gets it.
			pt.KeepSignal(tid, int(unix.SIGSEGV))
			return snaps, nil
		}
		if err := open(sf.Addr); err != nil {
			return snaps, err
		}
	}
	return snaps, fmt.Errorf("instruction at fault %#x keeps faulting", addr)
}

// record appends one traced write.
// Precondition: t.mu must be locked.
func (t *Tracer) record(r *Region, off uint64, data []byte) {
	t.writes = append(t.writes, write{r: r, off: off, data: data})
}

// recordRange records the current bytes of [addr, addr+n), split at
// region boundaries.
// Precondition: t.mu must be locked.
func (t *Tracer) recordRange(addr, n uint64) {
	for _, r := range t.regions {
		lo, hi := max(addr, r.GuestAddr), min(addr+n, r.GuestAddr+uint64(len(r.Mem)))
		if lo < hi {
			t.record(r, lo-r.GuestAddr, append([]byte(nil), r.Mem[lo-r.GuestAddr:hi-r.GuestAddr]...))
		}
	}
}

// Flush hands everything the guest wrote since the last flush to emit, in
// an order that keeps the final contents and the order of per-write
// records: changed ranges of page-batched regions first, then per-write
// records in program order. data is valid until emit returns.
//
// Everything the guest wrote before Flush was called is included; writes
// made while it runs may be included too (they are then in both this
// flush and the region's contents, never lost).
func (t *Tracer) Flush(emit func(r *Region, off uint64, data []byte)) error {
	t.mu.Lock()
	regions := append([]*Region(nil), t.regions...)
	t.stats.Flushes++
	t.mu.Unlock()

	if err := t.guestOpened(regions); err != nil {
		return err
	}
	var dirty []dirtyPages
	var err error
	if t.pt != nil { // page mode's dirty pages, and per-write pages opened for a signal frame or by the guest
		if dirty, err = t.reprotectDirty(regions); err != nil {
			return err
		}
	}
	if t.km != nil { // the module's events and the pages it left open
		open, err := t.kmodFlush(regions)
		if err != nil {
			return err
		}
		dirty = append(dirty, open...)
	}
	if t.opts.Mode == ModeUffd {
		open, err := t.scanUnsettled(regions)
		if err != nil {
			return err
		}
		dirty = append(dirty, open...)
	}
	var records, bytes, pages uint64
	send := func(r *Region, off uint64, data []byte) {
		records++
		bytes += uint64(len(data))
		emit(r, off, data)
	}
	for _, r := range regions {
		if r.full { // just added: the device copy starts from the region's contents
			r.full = false
			copy(r.shadow, r.Mem)
			send(r, 0, r.shadow)
		}
	}
	// Page-batched regions' changed ranges; then per-write records (kept
	// in the shadow, for the comparison after them); then the changed
	// ranges of per-write pages the guest had opened itself.
	changed := make([][]int, len(dirty)) // per dirty entry, per page: bytes sent
	sendPages := func(perWrite bool) {
		for i, d := range dirty {
			if t.perWrite(d.r) != perWrite {
				continue
			}
			changed[i] = make([]int, len(d.pages))
			for j, pg := range d.pages {
				pages++
				before := bytes
				d.r.sendChanged(pg*pageSize, (pg+1)*pageSize, send)
				changed[i][j] = int(bytes - before)
			}
		}
	}
	sendPages(false)
	for _, w := range t.takeWrites() {
		copy(w.r.shadow[w.off:], w.data)
		send(w.r, w.off, w.data)
	}
	sendPages(true)
	t.mu.Lock()
	t.pagesFlushed(regions, dirty, changed)
	t.stats.Records += records
	t.stats.Bytes += bytes
	t.stats.DirtyPages += pages
	t.mu.Unlock()
	t.opts.Metrics.flushed(t.opts.Mode, records, bytes, pages)
	return nil
}

// pagesFlushed keeps what a flush found on the pages it compared (dirty,
// with the bytes each changed): page-batched pages found unchanged are
// quiet (closed at the next flush), auto mode's pages hot or not.
// Precondition: t.mu must be locked.
func (t *Tracer) pagesFlushed(regions []*Region, dirty []dirtyPages, changed [][]int) {
	for i, d := range dirty {
		for j, pg := range d.pages {
			if !t.perWrite(d.r) {
				d.r.quiet[pg] = d.r.dirty[pg] && changed[i][j] == 0
			}
		}
	}
	for _, r := range regions {
		if r.auto == nil {
			continue
		}
		var pages []uint64
		var bytes []int
		for i, d := range dirty {
			if d.r == r {
				pages, bytes = append(pages, d.pages...), append(bytes, changed[i]...)
			}
		}
		t.autoFlushed(r, pages, bytes)
	}
}

// guestOpened marks dirty the pages of ptrace-protected regions that the
// guest made writable itself (mprotect), where its stores stopped
// faulting: the flush compares them with what was last sent and protects
// them again, so what the guest wrote there is caught and later stores
// fault as before.
func (t *Tracer) guestOpened(regions []*Region) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.maps == nil {
		return nil
	}
	found := uint64(0)
	for _, r := range regions {
		if !t.usesPtrace(r) || r.full {
			continue
		}
		err := vmaRanges(t.maps, r.GuestAddr, r.GuestAddr+uint64(len(r.Mem)), r.mappedAnd(writable), func(lo, hi uint64) {
			for pg := (lo - r.GuestAddr) / pageSize; pg < (hi-r.GuestAddr+pageSize-1)/pageSize; pg++ {
				if !r.dirty[pg] { // under t.mu every page the tracer opened is dirty
					r.dirty[pg] = true
					found++
				}
			}
		})
		if err != nil {
			return err
		}
	}
	t.stats.GuestOpened += found
	return nil
}

// Drain is the last flush, for a guest that has stopped writing (it
// exited, or its connection ended): it needs nothing from the guest
// process, comparing page-batched regions whole with what was last
// flushed. Call Close after it.
func (t *Tracer) Drain(emit func(r *Region, off uint64, data []byte)) {
	t.mu.Lock()
	regions := append([]*Region(nil), t.regions...)
	t.mu.Unlock()
	if t.km != nil {
		t.kmodEvents() // stores the module recorded before the guest stopped
	}
	for _, w := range t.takeWrites() {
		copy(w.r.shadow[w.off:], w.data)
		emit(w.r, w.off, w.data)
	}
	// Then every region whole: per-write regions too, for stores that did
	// not fault (pages the guest opened itself since the last flush).
	for _, r := range regions {
		if t.opts.Mode != ModeOff && !r.full {
			r.sendChanged(0, uint64(len(r.Mem)), emit)
		}
	}
}

// takeWrites hands over the per-write records since the last flush.
func (t *Tracer) takeWrites() []write {
	t.mu.Lock()
	defer t.mu.Unlock()
	w := t.writes
	t.writes = nil
	return w
}

// sendChanged emits the ranges of r.Mem[lo:hi] that differ from what was
// last flushed, records them as flushed, and reports whether there were
// any. data is the shadow copy.
func (r *Region) sendChanged(lo, hi uint64, emit func(*Region, uint64, []byte)) bool {
	cur, old := r.Mem[lo:hi], r.shadow[lo:hi]
	if string(cur) == string(old) { // memcmp: most pages opened are not written
		return false
	}
	diffRanges(old, cur, func(o, n int) {
		copy(old[o:o+n], cur[o:o+n])
		emit(r, lo+uint64(o), old[o:o+n])
	})
	return true
}

type dirtyPages struct {
	r     *Region
	pages []uint64 // page indexes within the region
}

// reprotectDirty protects again (in the guest, by an injected mprotect)
// the open pages due to close: every open page of a per-write region, and
// the quiet pages of a page-batched one (see Region.quiet) that start an
// open run, so the open pages stay the end of a run. It returns every open
// page, closed now or not, for the flush to compare. Pages are protected
// before their contents are read, so a write racing with the flush faults
// and lands in the next one. Nothing to close: the guest is not stopped.
func (t *Tracer) reprotectDirty(regions []*Region) ([]dirtyPages, error) {
	t.mu.Lock()
	anyOpen, anyClose := false, false
	for _, r := range regions {
		if !t.usesPtrace(r) {
			continue
		}
		t.openRuns(r, func(i, k, j int) {
			anyOpen = true
			anyClose = anyClose || k > i
		})
	}
	t.mu.Unlock()
	if !anyOpen {
		return nil, nil
	}
	if !anyClose {
		t.mu.Lock()
		defer t.mu.Unlock()
		return t.closePages(regions, 0, false)
	}
	var out []dirtyPages
	var perr error
	err := t.pt.Do(func(tid int) {
		// With every guest thread stopped, no system call is in flight:
		// an O_DIRECT read into open pages (the device writes them
		// through no page table) has finished, and once they are
		// protected none can pin them again. A thread that does not stop
		// may still have one in flight: the pages then stay open and
		// dirty, compared now and again at the next flush.
		// Threads seen waiting (futex, poll: see settle) are stopped
		// too: one may wake before the mprotect and start a read(2) into
		// the open pages, which would meet a page protected mid-copy and
		// return a short count.
		others, all := t.pt.StopOthers(tid)
		defer t.pt.ResumeOthers(others)
		t.mu.Lock()
		defer t.mu.Unlock()
		out, perr = t.closePages(regions, tid, all)
	})
	if err != nil {
		return nil, err
	}
	return out, perr
}

// openRuns calls fn for each run [i, j) of r's open pages, with [i, k)
// the pages to close now: all of a per-write region's, a page-batched
// region's quiet ones at the run's start.
// Precondition: t.mu must be locked.
func (t *Tracer) openRuns(r *Region, fn func(i, k, j int)) {
	for i := 0; i < len(r.dirty); {
		if !r.dirty[i] {
			i++
			continue
		}
		j := i
		for j < len(r.dirty) && r.dirty[j] {
			j++
		}
		k := j
		if !t.perWrite(r) {
			for k = i; k < j && r.quiet[k]; k++ {
			}
		}
		fn(i, k, j)
		i = j
	}
}

// closePages lists the open pages of the ptrace regions and, with protect
// (every guest thread stopped, tid one of them), protects those due to
// close.
// Precondition: t.mu must be locked.
func (t *Tracer) closePages(regions []*Region, tid int, protect bool) ([]dirtyPages, error) {
	var out []dirtyPages
	var perr error
	for _, r := range regions {
		if !t.usesPtrace(r) {
			continue
		}
		d := dirtyPages{r: r}
		t.openRuns(r, func(i, k, j int) {
			for pg := i; pg < j; pg++ {
				d.pages = append(d.pages, uint64(pg))
			}
			if !protect || k == i {
				return
			}
			for pg := i; pg < k; pg++ {
				r.dirty[pg], r.quiet[pg] = false, false
			}
			// Only what is writable now: a page the guest protected
			// itself since keeps its protection (compared all the same).
			lo, hi := r.GuestAddr+uint64(i)*pageSize, r.GuestAddr+uint64(k)*pageSize
			if err := vmaRanges(t.maps, lo, hi, r.mappedAnd(writable), func(lo, hi uint64) {
				if err := t.pt.Mprotect(tid, lo, hi-lo, t.prot); err != nil && perr == nil {
					perr = err
				}
			}); err != nil && perr == nil {
				perr = err
			}
		})
		if len(d.pages) > 0 {
			out = append(out, d)
		}
	}
	return out, perr
}

// diffRanges calls fn for each range where a and b differ, comparing
// 8-byte words and joining ranges less than 32 bytes apart.
func diffRanges(a, b []byte, fn func(off, n int)) {
	const gap = 32
	start, end := -1, -1
	for i := 0; i < len(a); i += 8 {
		j := min(i+8, len(a))
		if string(a[i:j]) == string(b[i:j]) {
			continue
		}
		if start >= 0 && i-end < gap {
			end = j
			continue
		}
		if start >= 0 {
			fn(start, end-start)
		}
		start, end = i, j
	}
	if start >= 0 {
		fn(start, end-start)
	}
}
