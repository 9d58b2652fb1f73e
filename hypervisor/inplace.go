package hypervisor

import (
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/internal/guesterr"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
)

// In-place copies. A guest on a shared-memory transport leaves a large
// host-to-device copy's data in the shared ring (abi.InPlace); the copy's
// fixed fields were read into private memory and are checked as any
// request's. The data is read exactly once, by whoever needs it:
//   - a replicated session reads it into a log buffer (a replicate.Draft):
//     the frame's checksum, the exactly-once checksum and the device copy
//     all use that private copy, and the log keeps it without copying;
//   - an unreplicated session copies it from the shared area straight to
//     the device, span by span as it arrives (the guest fills the next
//     span while the device takes this one). Only a null-stream copy is
//     done so: it is complete when the backend returns, so the span may go
//     back to the guest. A copy on a stream (which a backend may finish
//     later, from page-locked memory) is read into private memory first.
// A guest that rewrites the data while it is read garbles only its own
// copy: nothing the node decides depends on those bytes.

// inPlaceCopy is an in-place copy as a session runs it.
type inPlaceCopy struct {
	req     abi.Body
	payload []byte           // the whole body in private memory; nil when streamed
	draft   *replicate.Draft // payload's log buffer, until the log takes it
	held    int              // request-buffer budget held for payload
	data    *abi.InPlace
}

// takeInPlace decides where an in-place copy's data goes and, unless it is
// streamed to the device, reads it there (see above). fixed is the copy's
// fixed fields.
// Precondition: s.mu must be locked.
func (s *Session) takeInPlace(fixed []byte, data *abi.InPlace) (inPlaceCopy, error) {
	in := inPlaceCopy{req: data.Request(), data: data}
	if s.record == nil && data.Request().Stream == 0 {
		s.mem.inPlace = data
		s.srv.metrics.inPlace.WithLabelValues("device").Add(float64(data.Len()))
		return in, nil
	}
	n := len(fixed) + data.Len()
	if !s.srv.budget.Acquire(n) {
		return in, refuse(guesterr.BufferBudget, abi.StatusUnavailable,
			"the node's request buffers are full (%d-byte budget): %d-byte copy refused; retry", s.cfg.RequestBufferBytes, n)
	}
	in.held = n
	if s.record != nil {
		in.draft = s.record.log.NewDraft(n)
		in.payload = in.draft.Body()
	} else {
		in.payload = make([]byte, n)
	}
	copy(in.payload, fixed)
	if err := data.ReadInto(in.payload[len(fixed):]); err != nil {
		in.done(s)
		return inPlaceCopy{}, fail(abi.StatusBadFrame, "reading the copy's data: %w", err)
	}
	req, err := abi.DecodeRequest(abi.OpCopyHtoD, in.payload)
	if err != nil { // cannot be: the fixed fields were checked against the length
		in.done(s)
		return inPlaceCopy{}, fail(abi.StatusInvalidValue, "%w", err)
	}
	in.req = req
	to := "private"
	if in.draft != nil {
		to = "log"
	}
	s.srv.metrics.inPlace.WithLabelValues(to).Add(float64(data.Len()))
	return in, nil
}

// streamed reports whether the data goes from shared memory to the device.
func (in *inPlaceCopy) streamed() bool { return in.data != nil && in.payload == nil }

// takeDraft hands the log buffer to the log (nil if there is none).
func (in *inPlaceCopy) takeDraft() *replicate.Draft {
	d := in.draft
	in.draft = nil
	return d
}

// done gives back what the copy held.
// Precondition: s.mu must be locked.
func (in *inPlaceCopy) done(s *Session) {
	s.mem.inPlace = nil
	if in.draft != nil {
		in.draft.Discard()
		in.draft = nil
	}
	if in.held != 0 {
		s.srv.budget.Release(in.held)
		in.held = 0
	}
}

// copyInPlace copies the in-place data of the copy being run from shared
// memory to device address dst, span by span (the range was checked).
func (m *memory) copyInPlace(dst uint64, st gpu.Stream) error {
	return m.inPlace.Stream(func(off int, span []byte) error {
		return m.ctx.CopyHtoD(dst+uint64(off), span, st)
	})
}
