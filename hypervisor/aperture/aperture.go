// Package aperture is a session's apertures: device memory the guest
// writes directly through a shared mapping (pvdriver.MapAperture). The
// guest's memory file is the object's contents; the device allocation (in
// the session's window, so a standby has it at the same address) is
// brought up to date from it at every flush point — each guest call's
// entry and a timer — through the same OpMMIO records the standby applies
// (Apply). A kernel therefore sees every write the guest made before
// launching it, on the primary and on the replica alike. (The device does
// not see writes made after a launch while the kernel runs, and device
// writes to an aperture do not reach the guest's mapping: apertures carry
// guest-to-device data, like a doorbell page.)
//
// It owns a primary session's apertures, the tracer watching its guest
// process and the flush timer (Set), the OpMMIO bodies a flush becomes,
// and verify --apertures on both sides (Set.Verify on the primary,
// Comparisons on the standby). It must never write device memory that
// Device does not vouch for (every write of a body is checked first, a
// record from the log included), never log (the session does, with what
// emit is given), and never make a system call itself: taking the guest's
// memory file, finding its mapping and tracing are package mmiotrace's.
//
// A Set is guarded by its session's lock; its timer calls the session's
// tick, which takes that lock.
package aperture

import (
	"errors"
	"math/bits"
	"time"

	"github.com/vgpuha/vgpuha/hypervisor/internal/guesterr"
	"github.com/vgpuha/vgpuha/mmiotrace"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
)

// Device is a session's device memory as its apertures see it, in the
// guest's addresses (the session translates them).
type Device interface {
	// CheckRange refuses [addr, addr+n) unless it lies inside one of the
	// session's allocations.
	CheckRange(addr, n uint64, what string) error
	// Write copies data to addr; Read copies from addr into buf; both on
	// the null stream, complete when they return.
	Write(addr uint64, data []byte) error
	Read(buf []byte, addr uint64) error
	// Checksum is gpu.Checksum of [addr, addr+n).
	Checksum(addr, n uint64) (uint64, error)
}

// Config configures aperture tracing (package mmiotrace).
type Config struct {
	Mode mmiotrace.Mode
	// Pin puts the tracer and the guest's threads on one CPU while ptrace
	// traces them (3–4× cheaper per traced write).
	Pin bool
	// FlushEvery flushes a session's aperture writes on a timer too, for
	// guests that write without making calls.
	FlushEvery time.Duration
	// StepOnly single-steps every traced store instead of emulating it
	// (for measuring the paper's unprotect/step/re-protect path).
	StepOnly bool
}

// Set is a primary session's apertures and the tracer watching its guest
// process.
type Set struct {
	cfg       Config
	dev       Device
	tracer    *mmiotrace.Tracer
	apertures map[uint64]*aperture            // by device address
	byRegion  map[*mmiotrace.Region]*aperture // the tracer reports regions
	stopTimer chan struct{}
}

type aperture struct {
	ptr    uint64
	region *mmiotrace.Region
}

// New starts tracing guest process pid for a session whose memory is dev.
// With cfg.FlushEvery set, tick is called on that period, on a goroutine
// of its own, until Close (the session flushes under its lock).
func New(pid int, dev Device, cfg Config, metrics *mmiotrace.Metrics, tick func(*Set)) *Set {
	a := &Set{
		cfg: cfg, dev: dev,
		tracer:    mmiotrace.Attach(pid, mmiotrace.Options{Mode: cfg.Mode, Pin: cfg.Pin, StepOnly: cfg.StepOnly, Metrics: metrics}),
		apertures: map[uint64]*aperture{},
		byRegion:  map[*mmiotrace.Region]*aperture{},
		stopTimer: make(chan struct{}),
	}
	if cfg.FlushEvery > 0 {
		go a.flushTimer(tick)
	}
	return a
}

// Map maps guest process pid's memory file fd, of size bytes, to become
// an aperture (Add).
func Map(pid, fd int, size uint64, kind mmiotrace.Kind) (*mmiotrace.Region, error) {
	region, err := mmiotrace.MapGuestFile(pid, fd, size, kind)
	if err != nil {
		return nil, guesterr.Fail(abi.StatusInvalidValue, "aperture: %w", err)
	}
	return region, nil
}

// Add traces the writes to region (Map) as the aperture of the allocation
// at ptr, replacing an aperture already there (attaching again after a
// failover). The caller flushes next, so that the device copy starts from
// the file's contents. On an error the region is unmapped.
func (a *Set) Add(ptr uint64, region *mmiotrace.Region) error {
	a.Drop(ptr)
	if err := a.tracer.AddRegion(region); err != nil {
		mmiotrace.UnmapGuestFile(region.Mem)
		if errors.Is(err, mmiotrace.ErrSelfTrace) {
			return guesterr.Fail(abi.StatusNotSupported, "the guest is the hypervisor's own process: %w", err)
		}
		if errors.Is(err, mmiotrace.ErrUnsupportedArch) {
			return guesterr.Fail(abi.StatusNotSupported, "tracing the aperture: %w", err)
		}
		return guesterr.Fail(abi.StatusInternal, "tracing the aperture: %w", err)
	}
	ap := &aperture{ptr: ptr, region: region}
	a.apertures[ptr] = ap
	a.byRegion[region] = ap
	return nil
}

// Drop stops tracing the aperture at ptr, if there is one.
func (a *Set) Drop(ptr uint64) {
	ap := a.apertures[ptr]
	if ap == nil {
		return
	}
	a.tracer.RemoveRegion(ap.region)
	delete(a.apertures, ptr)
	delete(a.byRegion, ap.region)
	mmiotrace.UnmapGuestFile(ap.region.Mem)
}

// Len counts the apertures traced.
func (a *Set) Len() int { return len(a.apertures) }

// Close ends tracing when the guest's connection ends: a last flush (from
// the memory itself: the guest may be gone), then the tracer lets go of
// the guest, which writes on untraced into its files (the kmod modes leave
// their apertures to it: RemoveRegion would make its stores fail), and the
// mappings are dropped. A guest that resumes attaches again, here or on a
// promoted standby, which starts from the files' contents.
func (a *Set) Close(emit func(body []byte)) {
	a.emit(a.tracer.Drain, emit)
	a.tracer.Close()
	for _, ap := range a.apertures {
		mmiotrace.UnmapGuestFile(ap.region.Mem)
	}
	close(a.stopTimer)
}

// Flush moves the guest's aperture writes since the last flush into the
// device, and hands each OpMMIO body it wrote to emit (the log).
func (a *Set) Flush(emit func(body []byte)) error {
	var ferr error
	a.emit(func(out func(*mmiotrace.Region, uint64, []byte)) { ferr = a.tracer.Flush(out) }, emit)
	return ferr
}

// emit runs one flush and turns its output into OpMMIO bodies, each
// applied to the device (through the code the standby uses) and handed to
// emit.
func (a *Set) emit(flush func(out func(*mmiotrace.Region, uint64, []byte)), emit func(body []byte)) {
	var bodies [][]byte
	var body []byte
	var bodyPtr uint64
	flush(func(r *mmiotrace.Region, off uint64, data []byte) {
		ap := a.byRegion[r]
		if ap == nil {
			return
		}
		for len(data) > 0 {
			if body == nil || bodyPtr != ap.ptr || len(body) >= replicate.MaxMMIOBody-12 {
				if body != nil {
					bodies = append(bodies, body)
				}
				body, bodyPtr = replicate.AppendMMIOHeader(nil, ap.ptr), ap.ptr
			}
			n := min(len(data), replicate.MaxMMIOBody-12-len(body))
			body = replicate.AppendMMIOWrite(body, off, data[:n])
			off, data = off+uint64(n), data[n:]
		}
	})
	if body != nil {
		bodies = append(bodies, body)
	}
	for _, b := range bodies {
		if err := Apply(a.dev, b); err != nil {
			continue // cannot happen: the tracer only reports writes inside the aperture
		}
		emit(b)
	}
}

// Resend is repair for an aperture: its file's whole contents go to the
// device and the standby at the next flush. It reports false where addr
// is no aperture.
func (a *Set) Resend(addr uint64) bool {
	ap := a.apertures[addr]
	if ap == nil {
		return false
	}
	a.tracer.Resend(ap.region)
	return true
}

// Status is a session's aperture tracing in the node's status.
type Status struct {
	Mode      string `json:"mode"`
	Apertures int    `json:"apertures"`
	// PinnedCPU is the CPU the tracer and the guest's threads share while
	// ptrace traces them (-1: not pinned or no ptrace).
	PinnedCPU int    `json:"pinned_cpu"`
	Faults    uint64 `json:"faults"`
	Records   uint64 `json:"records"`
	Bytes     uint64 `json:"bytes"`
}

// Status reports the apertures' tracing.
func (a *Set) Status() *Status {
	st := a.tracer.Stats()
	return &Status{Mode: a.cfg.Mode.String(), Apertures: len(a.apertures), PinnedCPU: st.PinnedCPU,
		Faults: st.Faults, Records: st.Records, Bytes: st.Bytes}
}

// flushTimer calls tick on a timer, for guests that write without calling.
func (a *Set) flushTimer(tick func(*Set)) {
	t := time.NewTicker(a.cfg.FlushEvery)
	defer t.Stop()
	for {
		select {
		case <-a.stopTimer:
			return
		case <-t.C:
		}
		tick(a)
	}
}

// Apply writes an OpMMIO body's writes to dev, after checking that every
// one lies inside one of the session's allocations.
func Apply(dev Device, body []byte) error {
	if err := Check(dev, body); err != nil {
		return err
	}
	return replicate.DecodeMMIO(body, func(ptr, off uint64, data []byte) error {
		return dev.Write(ptr+off, data)
	})
}

// Check checks that every write of an OpMMIO body lies inside one of the
// session's allocations.
func Check(dev Device, body []byte) error {
	return replicate.DecodeMMIO(body, func(ptr, off uint64, data []byte) error {
		if _, carry := bits.Add64(ptr, off, 0); carry != 0 {
			return guesterr.Fail(abi.StatusOutOfRange, "aperture write at %#x+%#x wraps the address space", ptr, off)
		}
		return dev.CheckRange(ptr+off, uint64(len(data)), "aperture write")
	})
}
