package mmiotrace

import "golang.org/x/sys/unix"

// Auto mode: insn mode's per-write tracing, with a per-page choice for
// memory regions made from the write faults the tracer takes on each page.
//   - A page that takes more than autoStreak write faults between two
//     flushes (a streak: a buffer being filled) is opened at the next
//     fault: made writable until the next flush, which compares it, as
//     page mode does. The stores recorded before it opened are sent
//     first, then the ranges the page changed beyond them (Flush sends a
//     per-write region's open pages after its records), so the replica
//     ends as the guest's memory and the records keep their order.
//   - A page that streaked, or whose comparison found more than
//     autoStreak words changed, is hot for the next interval: it opens at
//     its first fault there, with the run of hot pages after it (a stream
//     moving up the region pays one fault per run and interval, as in
//     page mode). A hot page that changes little goes back to per-write.
//     The page after a page that opened is hot for the rest of the
//     interval (a stream moving up pays one fault per page from its
//     first streak on, not a streak per page).
//   - Other pages (doorbell-like: a few stores per flush) stay per write:
//     every store is a record, in program order, as in insn mode.
//
// Every page closes at every flush (a per-write region's open pages
// always do), with the streak counts reset. The rule holds as in insn and
// page mode: a store is either emulated and recorded, or lands in a page
// the next flush compares. Unlike page mode (which opens a page and every
// page after it), auto opens one page at a time: a system call writing
// into the region from an open page into a protected one returns a short
// count, and one starting at a protected page fails with EFAULT, as in
// insn mode. Register regions are per write, as in every mode.

// autoStreak is the write faults a page takes within one flush interval
// before auto mode opens it (the module's auto_streak default, too).
const autoStreak = 4

// autoState is a memory region's per-page record in auto mode.
type autoState struct {
	faults []uint8 // write faults since the last flush (saturating)
	hot    []bool  // streaked, or changed a lot, in the last interval: opens at its first fault
}

// autoPages reports whether r's pages are chosen per page (auto mode,
// memory regions).
func (t *Tracer) autoPages(r *Region) bool {
	return t.opts.Mode == ModeAuto && r.Kind == KindMemory
}

// autoOpen counts a write fault on addr's page of r (auto mode) and, once
// the page streaks or where it is hot, opens it until the next flush, a
// hot page with the hot pages after it up to vmaEnd (the end of the
// tracer-protected mapping holding addr): the store then runs again,
// natively. It reports whether it did (false: trace the store per write).
// Precondition: t.mu must be locked.
func (t *Tracer) autoOpen(tid int, r *Region, addr, vmaEnd uint64, open bool) bool {
	if r.auto == nil {
		r.auto = &autoState{faults: make([]uint8, len(r.dirty)), hot: make([]bool, len(r.dirty))}
	}
	pg := (addr - r.GuestAddr) / pageSize
	a := r.auto
	if a.faults[pg] < 255 {
		a.faults[pg]++
	}
	if !a.hot[pg] && a.faults[pg] <= autoStreak {
		return false
	}
	if open && r.dirty[pg] {
		return true // another thread's fault opened it meanwhile: the store just runs again
	}
	end := pg + 1
	if a.hot[pg] {
		limit := uint64(len(r.dirty))
		if vmaEnd < r.GuestAddr+uint64(len(r.Mem)) { // vmaEnd > addr
			limit = (vmaEnd - r.GuestAddr + pageSize - 1) / pageSize
		}
		for end < limit && a.hot[end] && !r.dirty[end] {
			end++
		}
	}
	if err := t.pt.Mprotect(tid, r.GuestAddr+pg*pageSize, (end-pg)*pageSize, unix.PROT_READ|unix.PROT_WRITE); err != nil {
		return false
	}
	for p := pg; p < end; p++ {
		r.dirty[p] = true
	}
	if end < uint64(len(r.dirty)) && !r.dirty[end] {
		a.hot[end] = true // a stream moving up: the next page opens at its first fault in this interval
	}
	if !a.hot[pg] {
		t.stats.Streaks++
	}
	return true
}

// autoFlushed records, for the next interval, which of r's compared pages
// are hot: those that streaked in this one, or whose comparison found more
// than autoStreak words changed beyond the records (changed bytes per
// page of pages); then every fault count starts again.
// Precondition: t.mu must be locked.
func (t *Tracer) autoFlushed(r *Region, pages []uint64, changed []int) {
	a := r.auto
	if a == nil {
		return
	}
	clear(a.hot)
	for i, pg := range pages {
		a.hot[pg] = a.faults[pg] > autoStreak || changed[i] > 8*autoStreak
	}
	clear(a.faults)
}
