package hypervisor

import (
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/internal/guesterr"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
)

// Where a copy's bytes come from is decided at the connection's edge
// (guestConn.request): in the frame (the body holds them), in the shared
// ring (abi.InPlace: a guest on a shared-memory transport leaves a large
// host-to-device copy's data there; the fixed fields were read into
// private memory and are checked as any request's), or in the guest's
// host-memory region (abi.HostCopy names an offset and a length in it,
// hostmem.go). A source out of the frame is read exactly once, by whoever
// needs it (Session.takeCopy):
//   - a replicated session reads it into a log buffer (a replicate.Draft):
//     the frame's checksum, the exactly-once checksum and the device copy
//     all use that private copy, and the log keeps it without copying; the
//     request runs, and is logged, as the copy_htod that buffer holds;
//   - an unreplicated session lets the device take it where it lies: from
//     the ring span by span as it arrives (the guest fills the next span
//     while the device takes this one), or from the region (copyHtoDHost).
//     Only a null-stream copy is streamed from the ring: it is complete
//     when the backend returns, so the span may go back to the guest. A
//     ring copy on a stream (which a backend may finish later, from
//     page-locked memory) is read into private memory first.
// A guest that rewrites the data while it is read garbles only its own
// copy: nothing the node decides depends on those bytes.

// copySource is where a host-to-device copy's bytes lie when the frame
// does not hold them.
type copySource interface {
	// open returns the copy (its destination and stream, without data)
	// and its bytes' length, checking what the request names (a region's
	// span) against what the connection holds.
	open(s *Session, req abi.Body) (*abi.CopyHtoD, int, error)
	// direct readies an unlogged copy for the device to take the bytes
	// where they lie, and returns the request to run as it came; false: it
	// cannot (they are read into private memory).
	direct(s *Session, req abi.Body) (abi.Body, bool)
	// readInto reads the bytes, once, into dst.
	readInto(dst []byte) error
	// label is the metrics label of bytes read into the log (logged) or
	// into private memory.
	label(logged bool) string
	// summed: the exactly-once checksum covers the bytes read (a region's
	// copy's content is where its data lies, not the data).
	summed() bool
}

// ringSource is a copy's data left in the shared ring (abi.InPlace).
type ringSource struct{ data *abi.InPlace }

func (r ringSource) open(*Session, abi.Body) (*abi.CopyHtoD, int, error) {
	return r.data.Request(), r.data.Len(), nil
}
func (r ringSource) readInto(dst []byte) error { return r.data.ReadInto(dst) }
func (r ringSource) summed() bool              { return true }

// direct streams a null-stream copy from the ring to the device (memory's
// copyHtoD takes it from there).
func (r ringSource) direct(s *Session, _ abi.Body) (abi.Body, bool) {
	req := r.data.Request()
	if req.Stream != 0 {
		return nil, false
	}
	s.mem.inPlace = r.data
	s.srv.metrics.inPlace.WithLabelValues("device").Add(float64(r.data.Len()))
	return req, true
}

func (r ringSource) label(logged bool) string {
	if logged {
		return "log"
	}
	return "private"
}

// hostSource is a copy's data in the connection's host-memory region.
type hostSource struct {
	region *hostRegion
	span   []byte // what the copy names, once open
}

func (h *hostSource) open(s *Session, req abi.Body) (*abi.CopyHtoD, int, error) {
	r := req.(*abi.HostCopy)
	span, err := h.region.span(r, s.cfg.MaxPayload)
	if err != nil {
		return nil, 0, err
	}
	h.span = span
	return &abi.CopyHtoD{Dst: r.Dev, Stream: r.Stream}, len(span), nil
}

// direct runs the host copy as it came: the device copies from the
// region (copyHtoDHost).
func (h *hostSource) direct(_ *Session, req abi.Body) (abi.Body, bool) { return req, true }
func (h *hostSource) readInto(dst []byte) error {
	copy(dst, h.span) // the one read of the guest's bytes
	return nil
}
func (h *hostSource) summed() bool      { return false }
func (h *hostSource) label(bool) string { return "hostmem_log" }

// inPlaceCopy is a copy from a source as a session runs it.
type inPlaceCopy struct {
	req     abi.Body
	payload []byte           // the whole copy_htod body in private memory; nil when direct
	draft   *replicate.Draft // payload's log buffer, until the log takes it
	held    int              // request-buffer budget held for payload
	direct  bool             // the device takes the bytes where they lie
}

// takeCopy decides where a copy's bytes from src go and, unless the
// device takes them where they lie, reads them there (see above). req is
// the decoded request (nil for a ring copy, whose fixed fields src has).
// Precondition: s.mu must be locked.
func (s *Session) takeCopy(src copySource, req abi.Body) (inPlaceCopy, error) {
	logged := s.record != nil
	if !logged {
		if run, ok := src.direct(s, req); ok {
			return inPlaceCopy{req: run, direct: true}, nil
		}
	}
	c, n, err := src.open(s, req)
	if err != nil {
		return inPlaceCopy{}, err
	}
	size := abi.CopyPrefixSize + n
	if !s.srv.budget.Acquire(size) {
		return inPlaceCopy{}, refuse(guesterr.BufferBudget, abi.StatusUnavailable,
			"the node's request buffers are full (%d-byte budget): %d-byte copy refused; retry", s.cfg.RequestBufferBytes, size)
	}
	in := inPlaceCopy{held: size}
	if logged {
		in.draft = s.record.log.NewDraft(size)
		in.payload = in.draft.Body()
	} else {
		in.payload = make([]byte, size)
	}
	abi.AppendCopyHtoDPrefix(in.payload[:0], c.Dst, c.Stream, uint32(n))
	if err := src.readInto(in.payload[abi.CopyPrefixSize:]); err != nil {
		in.done(s)
		return inPlaceCopy{}, fail(abi.StatusBadFrame, "reading the copy's data: %w", err)
	}
	if in.req, err = abi.DecodeRequest(abi.OpCopyHtoD, in.payload); err != nil { // cannot be: the body was just built
		in.done(s)
		return inPlaceCopy{}, fail(abi.StatusInternal, "%w", err)
	}
	s.srv.metrics.inPlace.WithLabelValues(src.label(logged)).Add(float64(n))
	return in, nil
}

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
