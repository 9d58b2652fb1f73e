package hypervisor

import (
	"cmp"
	"errors"
	"math/bits"
	"slices"
	"time"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/mmiotrace"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
)

// Apertures: device memory the guest writes directly through a shared
// mapping (pvdriver.MapAperture). The guest's memory file is the object's
// contents; the device allocation (in the session's window, so a standby
// has it at the same address) is brought up to date from it at every
// flush point — each guest call's entry and a timer — through the same
// OpMMIO records the standby applies. A kernel therefore sees every write
// the guest made before launching it, on the primary and on the replica
// alike. (The device does not see writes made after a launch while the
// kernel runs, and device writes to an aperture do not reach the guest's
// mapping: apertures carry guest-to-device data, like a doorbell page.)
// This file is the policy; taking the guest's memory file, finding its
// mapping and every other system call are mmiotrace's.

// sessionMMIO is a primary session's apertures and the tracer watching
// its guest process.
type sessionMMIO struct {
	tracer    *mmiotrace.Tracer
	apertures map[uint64]*aperture            // by device address
	byRegion  map[*mmiotrace.Region]*aperture // the tracer reports regions
	stopTimer chan struct{}
}

type aperture struct {
	ptr    uint64
	region *mmiotrace.Region
}

func (s *Session) apertureAttach(r *abi.ApertureAttach) (abi.Body, error) {
	kind := r.Kind
	if kind != abi.ApertureMemory && kind != abi.ApertureRegister {
		return nil, fail(abi.StatusInvalidValue, "unknown aperture kind %d", r.Kind)
	}
	rg, ok := s.mem.ranges.Find(r.Ptr, 0)
	if !ok || rg.Addr != r.Ptr {
		return nil, fail(abi.StatusInvalidValue, "aperture: no allocation of this session starts at %#x", r.Ptr)
	}
	if s.peerPID == 0 {
		return nil, fail(abi.StatusNotSupported, "apertures need a unix-socket connection: the hypervisor shares memory with the guest process")
	}
	mode := s.cfg.MMIO.Mode
	region, err := mmiotrace.MapGuestFile(s.peerPID, int(r.FD), rg.Size, kind)
	if err != nil {
		return nil, fail(abi.StatusInvalidValue, "aperture: %w", err)
	}
	s.dropAperture(r.Ptr) // attaching again (after a failover) replaces the old file
	if s.mmio == nil {
		s.mmio = &sessionMMIO{
			tracer:    mmiotrace.Attach(s.peerPID, mmiotrace.Options{Mode: mode, Pin: s.cfg.MMIO.Pin, StepOnly: s.cfg.MMIO.StepOnly, Metrics: s.mmioMetrics}),
			apertures: map[uint64]*aperture{},
			byRegion:  map[*mmiotrace.Region]*aperture{},
			stopTimer: make(chan struct{}),
		}
		if s.cfg.MMIO.FlushEvery > 0 {
			go s.flushTimer(s.mmio, s.cfg.MMIO.FlushEvery)
		}
	}
	if err := s.mmio.tracer.AddRegion(region); err != nil {
		mmiotrace.UnmapGuestFile(region.Mem)
		if errors.Is(err, mmiotrace.ErrSelfTrace) {
			return nil, fail(abi.StatusNotSupported, "the guest is the hypervisor's own process: %w", err)
		}
		if errors.Is(err, mmiotrace.ErrUnsupportedArch) {
			return nil, fail(abi.StatusNotSupported, "tracing the aperture: %w", err)
		}
		return nil, fail(abi.StatusInternal, "tracing the aperture: %w", err)
	}
	ap := &aperture{ptr: r.Ptr, region: region}
	s.mmio.apertures[r.Ptr] = ap
	s.mmio.byRegion[region] = ap
	if err := s.flushMMIO(); err != nil { // the device copy starts from the file's contents
		return nil, fail(abi.StatusInternal, "aperture: %w", err)
	}
	return &abi.ApertureReply{Mode: mode}, nil
}

// dropAperture stops tracing the aperture at ptr, if there is one.
// Precondition: s.mu must be locked.
func (s *Session) dropAperture(ptr uint64) {
	if s.mmio == nil {
		return
	}
	ap := s.mmio.apertures[ptr]
	if ap == nil {
		return
	}
	s.mmio.tracer.RemoveRegion(ap.region)
	delete(s.mmio.apertures, ptr)
	delete(s.mmio.byRegion, ap.region)
	mmiotrace.UnmapGuestFile(ap.region.Mem)
}

// stopMMIO ends tracing when the guest's connection ends: a last flush
// (from the memory itself: the guest may be gone), then the tracer lets go
// and the mappings are dropped. A guest that resumes attaches again.
// Precondition: s.mu must be locked.
func (s *Session) stopMMIO() {
	m := s.mmio
	if m == nil {
		return
	}
	s.emitMMIO(m.tracer.Drain)
	for ptr := range m.apertures {
		s.dropAperture(ptr)
	}
	m.tracer.Close()
	close(m.stopTimer)
	s.mmio = nil
}

// flushMMIO moves the guest's aperture writes since the last flush into
// the device and the log.
// Precondition: s.mu must be locked.
func (s *Session) flushMMIO() error {
	if s.mmio == nil {
		return nil
	}
	var ferr error
	s.emitMMIO(func(emit func(*mmiotrace.Region, uint64, []byte)) { ferr = s.mmio.tracer.Flush(emit) })
	return ferr
}

// emitMMIO runs one flush and turns its output into OpMMIO records, each
// applied to this session's device (through the code the standby uses)
// and logged.
// Precondition: s.mu must be locked.
func (s *Session) emitMMIO(flush func(emit func(*mmiotrace.Region, uint64, []byte))) {
	var bodies [][]byte
	var body []byte
	var bodyPtr uint64
	flush(func(r *mmiotrace.Region, off uint64, data []byte) {
		ap := s.mmio.byRegion[r]
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
		if err := s.applyMMIO(b); err != nil {
			continue // cannot happen: the tracer only reports writes inside the aperture
		}
		if s.record != nil {
			s.record.append(replicate.OpMMIO, 0, b, 0, 0, nil)
		}
	}
}

// applyMMIO writes an OpMMIO body's writes to device memory, after checking
// that every one lies inside one of the session's allocations.
// Precondition: s.mu must be locked.
func (s *Session) applyMMIO(body []byte) error {
	if err := s.checkMMIO(body); err != nil {
		return err
	}
	return replicate.DecodeMMIO(body, func(ptr, off uint64, data []byte) error {
		return s.ctx.CopyHtoD(s.mem.dev(ptr+off), data, 0)
	})
}

// checkMMIO checks that every write of an OpMMIO body lies inside one of
// the session's allocations.
// Precondition: s.mu must be locked.
func (s *Session) checkMMIO(body []byte) error {
	return replicate.DecodeMMIO(body, func(ptr, off uint64, data []byte) error {
		if _, carry := bits.Add64(ptr, off, 0); carry != 0 {
			return fail(abi.StatusOutOfRange, "aperture write at %#x+%#x wraps the address space", ptr, off)
		}
		return s.mem.CheckRange(ptr+off, uint64(len(data)), "aperture write")
	})
}

// apertureVerify is a standby's byte comparisons of apertures for one
// verification (verify --apertures), by device address.
type apertureVerify struct {
	id     uint64
	checks map[uint64]*apertureDiff
}

type apertureDiff struct{ mismatched, first uint64 }

func (d *apertureDiff) add(mismatched, first uint64) {
	d.mismatched += mismatched
	d.first = min(d.first, first)
}

// verifyApertures is verify --apertures on the primary: each aperture's
// file compared byte by byte with this node's device copy (ObjAperture
// sums), and the OpVerifyMMIO records that carry the file to the standby,
// which compares it with its own copy.
// Precondition: s.mu must be locked.
func (s *Session) verifyApertures(id uint64) (sums []replicate.ObjectSum, recs []replicate.Record) {
	if s.mmio == nil {
		return nil, nil
	}
	ptrs := make([]uint64, 0, len(s.mmio.apertures))
	for ptr := range s.mmio.apertures {
		ptrs = append(ptrs, ptr)
	}
	slices.Sort(ptrs)
	const chunk = replicate.MaxMMIOBody - 20 // header and one write's
	for _, ptr := range ptrs {
		file := s.mmio.apertures[ptr].region.Mem
		d := apertureDiff{first: replicate.NoMismatch}
		dev := make([]byte, min(len(file), chunk))
		for off := 0; off < len(file); off += chunk {
			part := file[off:min(off+chunk, len(file))]
			d.add(s.compareDevice(ptr, uint64(off), part, dev[:len(part)]))
			body := replicate.AppendMMIOWrite(replicate.AppendMMIOHeader(nil, ptr), uint64(off), part)
			recs = append(recs, replicate.Record{Session: s.id, Op: replicate.OpVerifyMMIO, Result: id, Body: body})
		}
		sums = append(sums, replicate.ApertureSum(s.id, ptr, d.mismatched, d.first))
	}
	return sums, recs
}

// compareDevice compares want, an aperture's bytes at offset off, with
// the device copy there (read into buf, as long as want) and returns the
// mismatched bytes and the first mismatched offset in the aperture
// (replicate.NoMismatch when none). An unreadable copy mismatches whole.
// Precondition: s.mu must be locked.
func (s *Session) compareDevice(ptr, off uint64, want, buf []byte) (mismatched, first uint64) {
	if err := s.ctx.CopyDtoH(buf, s.mem.dev(ptr+off), 0); err != nil {
		return uint64(len(want)), off
	}
	if mismatched, first = replicate.DiffBytes(want, buf); first != replicate.NoMismatch {
		first += off
	}
	return mismatched, first
}

// compareMMIO is a standby's part of verify --apertures: an OpVerifyMMIO
// record's bytes (the primary's aperture file) compared with this node's
// device copy, kept for the verification's answer (apertureSums). A write
// outside the session's allocations fails the record, as in applyMMIO.
// Precondition: s.mu must be locked.
func (s *Session) compareMMIO(id uint64, body []byte) error {
	if err := s.checkMMIO(body); err != nil {
		return err
	}
	if s.verifyMMIO == nil || s.verifyMMIO.id != id {
		s.verifyMMIO = &apertureVerify{id: id, checks: map[uint64]*apertureDiff{}}
	}
	return replicate.DecodeMMIO(body, func(ptr, off uint64, data []byte) error {
		d := s.verifyMMIO.checks[ptr]
		if d == nil {
			d = &apertureDiff{first: replicate.NoMismatch}
			s.verifyMMIO.checks[ptr] = d
		}
		d.add(s.compareDevice(ptr, off, data, make([]byte, len(data))))
		return nil
	})
}

// apertureSums hands over a standby's aperture comparisons for the
// verification it answers now (ObjAperture sums), in address order.
// Precondition: s.mu must be locked.
func (s *Session) apertureSums() []replicate.ObjectSum {
	v := s.verifyMMIO
	s.verifyMMIO = nil
	if v == nil {
		return nil
	}
	var sums []replicate.ObjectSum
	for ptr, d := range v.checks {
		sums = append(sums, replicate.ApertureSum(s.id, ptr, d.mismatched, d.first))
	}
	slices.SortFunc(sums, func(a, b replicate.ObjectSum) int { return cmp.Compare(a.ID, b.ID) })
	return sums
}

// apertureSum is what verify reports for the allocation at addr when it is
// one of this session's apertures: the checksum of the guest's file (what
// the guest wrote is the truth the device copies must hold), inverted
// where this node's own device copy differs from it, so that a write the
// tracer lost shows as a mismatch whether it is missing on the primary,
// the standby or both. ok is false for other allocations. The caller
// flushed first; a guest still writing its aperture meanwhile may show
// as a mismatch too (verify again).
// Precondition: s.mu must be locked.
func (s *Session) apertureSum(addr uint64) (sum uint64, ok bool) {
	if s.mmio == nil || s.mmio.apertures[addr] == nil {
		return 0, false
	}
	mem := s.mmio.apertures[addr].region.Mem
	file := gpu.Checksum(mem)
	if dev, err := s.mem.checksum(addr, uint64(len(mem))); err != nil || dev != file {
		return ^file, true
	}
	return file, true
}

// resendAperture is repair for an aperture: its file's whole contents
// go to the device and the standby at once, as one more flush. ok is false
// where addr is no aperture of this session.
// Precondition: s.mu must be locked.
func (s *Session) resendAperture(addr uint64) (ok bool, err error) {
	if s.mmio == nil || s.mmio.apertures[addr] == nil {
		return false, nil
	}
	s.mmio.tracer.Resend(s.mmio.apertures[addr].region)
	return true, s.flushMMIO()
}

// mmioStatus reports the session's aperture tracing, or nil.
// Precondition: s.mu must be locked.
func (s *Session) mmioStatus() *MMIOStatus {
	if s.mmio == nil {
		return nil
	}
	st := s.mmio.tracer.Stats()
	return &MMIOStatus{Mode: s.cfg.MMIO.Mode.String(), Apertures: len(s.mmio.apertures), PinnedCPU: st.PinnedCPU,
		Faults: st.Faults, Records: st.Records, Bytes: st.Bytes}
}

// flushTimer flushes on a timer, for guests that write without calling.
func (s *Session) flushTimer(m *sessionMMIO, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-m.stopTimer:
			return
		case <-t.C:
		}
		s.timedFlush(m)
	}
}

func (s *Session) timedFlush(m *sessionMMIO) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.recoverFlush()
	if s.mmio == m && !s.closed && s.failed == "" {
		// Not armed yet: the guest arms a new aperture before its next
		// call, whose flush reports it if it did not.
		if err := s.flushMMIO(); errors.Is(err, mmiotrace.ErrGuestGone) {
			s.stopMMIO()
		}
	}
}
