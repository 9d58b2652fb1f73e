package hypervisor

import (
	"github.com/vgpuha/vgpuha/hypervisor/guestconn"
	"github.com/vgpuha/vgpuha/hypervisor/internal/guesterr"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
)

// Where a copy's bytes come from is decided at the connection's edge
// (guestconn.Source): in the frame (the body holds them), in the shared
// ring (guestconn.Ring: a guest on a shared-memory transport leaves a
// large host-to-device copy's data there; the fixed fields were read into
// private memory and are checked as any request's), or in the guest's
// host-memory region (guestconn.Host: abi.HostCopy names an offset and a
// length in it). A source out of the frame is read exactly once, by
// whoever needs it (Session.takeCopy):
//   - a replicated session reads it into a log buffer (a replicate.Draft):
//     the frame's checksum, the exactly-once checksum and the device copy
//     all use that private copy, and the log keeps it without copying; the
//     request runs, and is logged, as the copy_htod that buffer holds (a
//     replica never needs the guest's region);
//   - an unreplicated session lets the device take it where it lies: from
//     the ring span by span as it arrives (the guest fills the next span
//     while the device takes this one), or from the region (copyHtoDHost;
//     on a stream it may still run when the reply goes, CUDA's rule for
//     page-locked memory, so the connection waits for the session's device
//     work before it lets the region go). Only a null-stream copy is
//     streamed from the ring: it is complete when the backend returns, so
//     the span may go back to the guest. A ring copy on a stream (which a
//     backend may finish later, from page-locked memory) is read into
//     private memory first.
// A guest that rewrites the data while it is read garbles only its own
// copy: nothing the node decides depends on those bytes.

// inPlaceCopy is a copy from a source as a session runs it.
type inPlaceCopy struct {
	req     abi.Body
	payload []byte           // the whole copy_htod body in private memory; nil when direct
	draft   *replicate.Draft // payload's log buffer, until the log takes it
	held    int              // request-buffer budget held for payload
	direct  bool             // the device takes the bytes where they lie
}

// copyBytes is a source's copy, opened: the copy without its data, the
// data's length, how to read it once, and the metrics label of bytes read
// into the log (logged) or into private memory.
type copyBytes struct {
	copy  *abi.CopyHtoD
	n     int
	read  func(dst []byte) error
	label func(logged bool) string
}

// takeCopy decides where a copy's bytes from src go and, unless the
// device takes them where they lie, reads them there (see above). req is
// the decoded request (nil for a ring copy, whose fixed fields src has).
// Precondition: s.mu must be locked.
func (s *Session) takeCopy(src guestconn.Source, req abi.Body) (inPlaceCopy, error) {
	logged := s.record != nil
	var b copyBytes
	switch src := src.(type) {
	case guestconn.Ring:
		c := src.Data.Request()
		if !logged && c.Stream == 0 { // memory's copyHtoD streams it
			s.mem.StreamFrom(src.Data)
			s.srv.metrics.inPlace.WithLabelValues("device").Add(float64(src.Data.Len()))
			return inPlaceCopy{req: c, direct: true}, nil
		}
		b = copyBytes{copy: c, n: src.Data.Len(), read: src.Data.ReadInto, label: ringLabel}
	case guestconn.Host:
		if !logged {
			return inPlaceCopy{req: req, direct: true}, nil // copyHtoDHost
		}
		r := req.(*abi.HostCopy)
		span, err := src.Region.Span(r, s.cfg.MaxPayload)
		if err != nil {
			return inPlaceCopy{}, err
		}
		b = copyBytes{copy: &abi.CopyHtoD{Dst: r.Dev, Stream: r.Stream}, n: len(span), label: hostLabel,
			read: func(dst []byte) error { copy(dst, span); return nil }} // the one read of the guest's bytes
	}
	return s.readCopy(b, logged)
}

func ringLabel(logged bool) string {
	if logged {
		return "log"
	}
	return "private"
}

func hostLabel(bool) string { return "hostmem_log" }

// readCopy reads an opened copy's bytes, once, into a copy_htod body in a
// log buffer (logged) or private memory.
// Precondition: s.mu must be locked.
func (s *Session) readCopy(b copyBytes, logged bool) (inPlaceCopy, error) {
	size := abi.CopyPrefixSize + b.n
	if !s.srv.edge.Budget().Acquire(size) {
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
	abi.AppendCopyHtoDPrefix(in.payload[:0], b.copy.Dst, b.copy.Stream, uint32(b.n))
	if err := b.read(in.payload[abi.CopyPrefixSize:]); err != nil {
		in.done(s)
		return inPlaceCopy{}, fail(abi.StatusBadFrame, "reading the copy's data: %w", err)
	}
	var err error
	if in.req, err = abi.DecodeRequest(abi.OpCopyHtoD, in.payload); err != nil { // cannot be: the body was just built
		in.done(s)
		return inPlaceCopy{}, fail(abi.StatusInternal, "%w", err)
	}
	s.srv.metrics.inPlace.WithLabelValues(b.label(logged)).Add(float64(b.n))
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
	s.mem.StreamFrom(nil)
	if in.draft != nil {
		in.draft.Discard()
		in.draft = nil
	}
	if in.held != 0 {
		s.srv.edge.Budget().Release(in.held)
		in.held = 0
	}
}
