package hypervisor

import (
	"errors"

	"github.com/vgpuha/vgpuha/hypervisor/aperture"
	"github.com/vgpuha/vgpuha/mmiotrace"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
)

// A session's apertures (package aperture): device memory its guest writes
// directly through a shared mapping, brought up to date, and logged, at
// every flush point: each call's entry (admit) and a timer.

func (s *Session) apertureAttach(r *abi.ApertureAttach) (abi.Body, error) {
	kind := r.Kind
	if kind != abi.ApertureMemory && kind != abi.ApertureRegister {
		return nil, fail(abi.StatusInvalidValue, "unknown aperture kind %d", r.Kind)
	}
	rg, ok := s.mem.Allocation(r.Ptr)
	if !ok {
		return nil, fail(abi.StatusInvalidValue, "aperture: no allocation of this session starts at %#x", r.Ptr)
	}
	if s.peerPID == 0 {
		return nil, fail(abi.StatusNotSupported, "apertures need a unix-socket connection: the hypervisor shares memory with the guest process")
	}
	region, err := aperture.Map(s.peerPID, int(r.FD), rg.Size, kind)
	if err != nil {
		return nil, err
	}
	if s.mmio == nil {
		s.mmio = aperture.New(s.peerPID, s.mem, s.cfg.MMIO, s.mmioMetrics, s.timedFlush)
	}
	if err := s.mmio.Add(r.Ptr, region); err != nil {
		return nil, err
	}
	if err := s.flushMMIO(); err != nil { // the device copy starts from the file's contents
		return nil, fail(abi.StatusInternal, "aperture: %w", err)
	}
	return &abi.ApertureReply{Mode: s.cfg.MMIO.Mode}, nil
}

// flushMMIO moves the guest's aperture writes since the last flush into
// the device and the log.
// Precondition: s.mu must be locked.
func (s *Session) flushMMIO() error {
	if s.mmio == nil {
		return nil
	}
	return s.mmio.Flush(s.logMMIO)
}

// logMMIO logs an OpMMIO body a flush wrote to the device.
// Precondition: s.mu must be locked.
func (s *Session) logMMIO(body []byte) {
	if s.record != nil {
		s.record.append(replicate.OpMMIO, 0, body, 0, 0, nil)
	}
}

// stopMMIO ends tracing when the guest's connection ends (a last flush,
// then the tracer lets go). A guest that resumes attaches again.
// Precondition: s.mu must be locked.
func (s *Session) stopMMIO() {
	if s.mmio != nil {
		s.mmio.Close(s.logMMIO)
		s.mmio = nil
	}
}

// timedFlush is the aperture timer's flush, for guests that write without
// calling.
func (s *Session) timedFlush(m *aperture.Set) {
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
