package mmiotrace

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vgpuha/vgpuha/kmod"
	"github.com/vgpuha/vgpuha/mmiotrace/x86store"
)

// The kmod modes: the vgpuha_mmio kernel module traces the guest's stores
// (kmod/module). AddRegion creates a module aperture over the region's
// pages (the tracer's mapping of the guest's memory file, pinned by the
// module) and puts it in place of the guest's mapping, at the same
// address, by an open+mmap(MAP_FIXED) injected through ptrace; the tracer
// then lets go of the guest. From there no store reaches this process:
//   - kmod: every store faults into the module, runs under the trap flag,
//     and the debug trap records its bytes; Flush reads those events and
//     turns each into a record, its width decoded from the instruction's
//     bytes (x86asm); a store the decoder cannot bound is recorded with
//     the module's 64-byte window and its page compared as well.
//   - kmod-page: memory regions are page-batched by the module (first
//     store per page per flush); register regions per store as in kmod.
//   - kmod-auto: per store as in kmod, but a page of a memory region that
//     takes more than the module's auto_streak stores between two flushes
//     stays open until the next flush, which compares it (after the
//     records of the stores before): streaks cost a fault per page,
//     doorbell-like pages keep their stores' order. Register regions per
//     store.
//
// Either way, pages the module left open (its ring was full, a signal
// handler moved the thread off the store, another thread stored during a
// step it could not send) are listed by the module's flush, which takes
// them away again, and compared. A system call storing into a per-write
// aperture fails with EFAULT. After RemoveRegion the guest's stores to
// the region are refused (SIGBUS): never lost silently.
//
// Close (the guest's connection ended: it may resume, here or on a
// promoted standby) leaves the apertures to the guest instead: the module
// lets its stores go on into its memory file's pages, marking each page
// open, as the ptrace modes unprotect their pages. A node the session
// resumes on attaches the file again: MapGuestFile finds the module's
// mapping where the file's was (kmodGuestViews), and AddRegion adopts the
// aperture (kmod.Device.Adopt: the module checks the guest is the one it
// was created for, that this process may trace it and maps the very file
// behind it, at the same offsets) without touching the guest; the first
// flush sends the region whole, as at any attach, and the module's list
// of pages stored to meanwhile. The guest keeps its address and never
// sees a fault it would not have seen anyway.

// KmodAvailable reports whether the kmod modes can run here (the module
// is loaded), or why not.
func KmodAvailable() error {
	d, err := kmod.Open()
	if err != nil {
		return err
	}
	return d.Close()
}

// ModeAvailable reports whether mode m can run on this machine, or why
// not, with the fix.
func ModeAvailable(m Mode) error {
	switch m {
	case ModeUffd:
		return UffdAvailable()
	case ModeKmod, ModeKmodPage, ModeKmodAuto:
		return KmodAvailable()
	}
	return nil
}

// atFDCWD is AT_FDCWD as a system call argument.
var atFDCWD = func() uint64 { v := int64(unix.AT_FDCWD); return uint64(v) }()

// kmodState is a Tracer's module side.
type kmodState struct {
	dev     *kmod.Device
	aps     map[*Region]kmod.Aperture
	buf     []byte
	insns   map[string]*x86store.Access // decoded instructions by their bytes
	leaving bool                        // Close: the apertures are left to the guest, not destroyed
}

// kmodView is a guest mapping of the module's device: the guest's view of
// aperture id, at addr.
type kmodView struct {
	addr uint64
	id   uint32
}

// kmodGuestViews lists the guest's mappings of the module's guest views
// that are size bytes long: one of them may be an aperture over the file
// being attached (the module's Adopt tells which).
func kmodGuestViews(pid int, size uint64) ([]kmodView, error) {
	var node unix.Stat_t
	if err := unix.Stat(kmod.DevicePath, &node); err != nil {
		return nil, errNotMapped // no module here: the file is simply not mapped
	}
	var views []kmodView
	err := fileMappings(pid, node, func(lo, hi uint64, perms string, off uint64) {
		if id, ok := kmod.GuestView(off); ok && hi-lo == size && strings.HasSuffix(perms, "s") {
			views = append(views, kmodView{addr: lo, id: id})
		}
	})
	if err != nil {
		return nil, err
	}
	if len(views) == 0 {
		return nil, errNotMapped
	}
	return views, nil
}

func (t *Tracer) usesKmod() bool {
	return t.opts.Mode == ModeKmod || t.opts.Mode == ModeKmodPage || t.opts.Mode == ModeKmodAuto
}

// addKmodRegion traces r through the module.
func (t *Tracer) addKmodRegion(r *Region) error {
	if t.km == nil {
		d, err := kmod.Open()
		if err != nil {
			return err
		}
		t.km = &kmodState{dev: d, aps: map[*Region]kmod.Aperture{}, buf: make([]byte, 256*kmod.EventSize), insns: map[string]*x86store.Access{}}
	}
	mode := kmod.ModeWrite
	switch {
	case !t.perWrite(r):
		mode = kmod.ModePage
	case t.opts.Mode == ModeKmodAuto && r.Kind == KindMemory:
		mode = kmod.ModeAuto
	}
	if len(r.kmodViews) > 0 {
		return t.adoptKmodRegion(r, mode)
	}
	a, err := t.km.dev.CreateOver(t.pid, r.Mem, mode)
	if err != nil {
		return err
	}
	if err := t.remapGuest(r, a); err != nil {
		t.km.dev.Destroy(a.ID)
		return err
	}
	t.mu.Lock()
	t.km.aps[r] = a
	t.mu.Unlock()
	return nil
}

// adoptKmodRegion takes over the module's aperture over r's file, which a
// tracer that let go of the guest left to it (Close), and traces it in
// mode: r is the guest's view the module accepts (the guest's, over the
// pages of r.Mem's file at the same offsets).
func (t *Tracer) adoptKmodRegion(r *Region, mode int) error {
	var errs []error
	for _, v := range r.kmodViews {
		a, at, err := t.km.dev.Adopt(v.id, t.pid, r.Mem, mode)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if at != v.addr {
			// The guest moved or dropped the mapping meanwhile: let go
			// (its stores are refused from here), never trace elsewhere.
			t.km.dev.Destroy(a.ID)
			return fmt.Errorf("the guest's view of aperture %d moved from %#x to %#x while it was adopted", v.id, v.addr, at)
		}
		t.mu.Lock()
		r.GuestAddr = at
		t.km.aps[r] = a
		t.mu.Unlock()
		return nil
	}
	return fmt.Errorf("the guest maps no module aperture over this file that this node may take over: %w", errors.Join(errs...))
}

// remapGuest maps aperture a over the guest's mapping of r (same address,
// same pages), by system calls injected into a stopped guest thread, then
// detaches from the guest. The device's path is written, for the
// injected open, over the region's first bytes (no guest code has the
// aperture before its attach returns) and put back after.
func (t *Tracer) remapGuest(r *Region, a kmod.Aperture) error {
	if err := t.startPtrace(); err != nil {
		return err
	}
	defer t.stopPtrace()
	mem, err := os.OpenFile(fmt.Sprintf("/proc/%d/mem", t.pid), os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("opening the guest's memory: %w", err)
	}
	defer mem.Close()
	path := []byte(kmod.DevicePath + "\x00")
	saved := make([]byte, len(path))
	var ierr error
	err = t.pt.Do(func(tid int) {
		if _, ierr = mem.ReadAt(saved, int64(r.GuestAddr)); ierr != nil {
			return
		}
		if _, ierr = mem.WriteAt(path, int64(r.GuestAddr)); ierr != nil {
			return
		}
		fd, err := t.pt.Inject(tid, unix.SYS_OPENAT, atFDCWD, r.GuestAddr, unix.O_RDWR|unix.O_CLOEXEC)
		if _, err2 := mem.WriteAt(saved, int64(r.GuestAddr)); err == nil {
			err = err2
		}
		if ierr = err; err != nil {
			return
		}
		if fd < 0 {
			ierr = fmt.Errorf("opening %s in the guest: %w", kmod.DevicePath, syscall.Errno(-fd))
			return
		}
		at, err := t.pt.Inject(tid, unix.SYS_MMAP, r.GuestAddr, uint64(len(r.Mem)), unix.PROT_READ|unix.PROT_WRITE,
			unix.MAP_SHARED|unix.MAP_FIXED, uint64(fd), a.GuestOff)
		t.pt.Inject(tid, unix.SYS_CLOSE, uint64(fd))
		switch {
		case err != nil:
			ierr = err
		case at < 0 && at > -4096:
			ierr = fmt.Errorf("mapping the module's aperture in the guest: %w", syscall.Errno(-at))
		case uint64(at) != r.GuestAddr:
			ierr = fmt.Errorf("the module's aperture landed at %#x in the guest, not %#x", at, r.GuestAddr)
		}
	})
	return errors.Join(err, ierr)
}

// stopPtrace detaches from the guest: the module traces it from here.
func (t *Tracer) stopPtrace() {
	t.mu.Lock()
	pt, maps := t.pt, t.maps
	t.pt, t.maps = nil, nil
	t.stats.PtraceAttached = false
	t.mu.Unlock()
	if pt != nil {
		pt.Close()
	}
	if maps != nil {
		maps.Close()
	}
}

// kmodFlush takes the open pages of every module aperture away (the module
// lists them: compare them) and turns the module's events into records.
func (t *Tracer) kmodFlush(regions []*Region) ([]dirtyPages, error) {
	var dirty []dirtyPages
	for _, r := range regions {
		t.mu.Lock()
		a, ok := t.km.aps[r]
		t.mu.Unlock()
		if !ok {
			continue
		}
		pages, err := t.km.dev.Flush(a)
		if err != nil {
			return nil, err
		}
		if len(pages) > 0 {
			dirty = append(dirty, dirtyPages{r: r, pages: pages})
			if !t.perWrite(r) {
				t.mu.Lock()
				t.stats.Faults += uint64(len(pages)) // page mode: one fault per page opened
				t.mu.Unlock()
			}
		}
	}
	more, err := t.kmodEvents()
	return mergePages(regions, dirty, more), err
}

// kmodEvents reads the module's events and records each store; it returns
// the pages of stores the decoder could not bound, to be compared too.
func (t *Tracer) kmodEvents() ([]dirtyPages, error) {
	evs, err := t.km.dev.ReadEvents(nil, t.km.buf)
	t.mu.Lock()
	defer t.mu.Unlock()
	byID := map[uint32]*Region{}
	for r, a := range t.km.aps {
		byID[a.ID] = r
	}
	var compare []dirtyPages
	var lastIP uint64 // of the last store recorded, if a REP string store
	for _, e := range evs {
		r := byID[e.ID]
		if r == nil || e.Off >= uint64(len(r.Mem)) {
			continue // a region removed since (its pending records went with it)
		}
		a, data, bounded := t.kmodStore(e)
		data = data[:min(uint64(len(data)), uint64(len(r.Mem))-e.Off)]
		if e.Type == kmod.EventStore {
			t.stats.Faults++
			t.opts.Metrics.fault(t.opts.Mode)
		}
		if !bounded {
			t.stats.Undecodable++
			compare = append(compare, dirtyPages{r: r, pages: []uint64{e.Off / pageSize}})
		}
		if rep := a != nil && a.Rep(); rep && e.IP == lastIP && t.extendRep(r, e.Off, data) {
			continue
		} else if rep {
			lastIP = e.IP
		} else {
			lastIP = 0
		}
		t.record(r, e.Off, append([]byte(nil), data...))
	}
	return compare, err
}

// extendRep joins the element a REP string store just stored (each
// element takes its own trap) to the record of the elements before it,
// when it is adjacent (above, or below when the string runs down), so a
// REP STOS or MOVS is one record, as in insn mode.
// Precondition: t.mu must be locked.
func (t *Tracer) extendRep(r *Region, off uint64, data []byte) bool {
	if len(t.writes) == 0 {
		return false
	}
	w := &t.writes[len(t.writes)-1]
	switch {
	case w.r != r:
		return false
	case off == w.off+uint64(len(w.data)):
		w.data = append(w.data, data...)
	case off+uint64(len(data)) == w.off:
		w.data = append(append([]byte(nil), data...), w.data...)
		w.off = off
	default:
		return false
	}
	return true
}

// kmodStore is what event e stored: the decoded width of the store's
// bytes, or the module's whole window where the decoder cannot bound it.
// Precondition: t.mu must be locked.
func (t *Tracer) kmodStore(e kmod.Event) (a *x86store.Access, data []byte, bounded bool) {
	if e.Type != kmod.EventStore {
		return nil, e.Data, true // a range another thread stored: its bytes as they are
	}
	a, ok := t.km.insns[string(e.Insn)]
	if !ok {
		a, _ = x86store.Decode(e.Insn)
		if len(t.km.insns) < 4096 {
			t.km.insns[string(e.Insn)] = a
		}
	}
	if a == nil || !a.Bounded() || a.Width() <= 0 || a.Width() > len(e.Data) {
		return a, e.Data, false
	}
	return a, e.Data[:a.Width()], true
}

// removeKmodRegion lets go of r: the guest's later stores to it are
// refused.
func (t *Tracer) removeKmodRegion(r *Region) {
	t.mu.Lock()
	a, ok := t.km.aps[r]
	delete(t.km.aps, r)
	leave := t.km.leaving
	t.mu.Unlock()
	if ok && !leave {
		t.km.dev.Destroy(a.ID)
	}
}

// leaveKmod makes Close leave the module's apertures to the guest: closing
// the device then orphans them (see the kmod modes above).
func (t *Tracer) leaveKmod() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.km != nil {
		t.km.leaving = true
	}
}
