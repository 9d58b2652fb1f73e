package abi

import (
	"encoding/binary"
	"hash/crc32"
	"io"
)

// In-place payloads. Over a shared-memory transport a host-to-device
// copy's data is already in memory the hypervisor can read: copying it
// into a frame buffer first would read it twice. A FrameReader given a
// SpanReader (SetSpanReader) therefore reads such a frame's header and the
// copy's fixed fields into private memory, checks them, and leaves the
// data in the stream for the caller to take once (InPlace): into private
// memory with the frame's checksum checked over that copy (ReadInto), or
// span by span straight where it lies (Stream), e.g. to a device copy.
//
// Stream cannot check the frame's checksum: that would read every byte a
// second time. It is dropped only there, and only for shared memory, where
// it guards nothing: shared memory has no transmission errors, and the
// stream cannot fall out of step (its position is the reader's own, and
// every header field is checked), so a guest that garbles its data
// garbles its own device memory and nothing else, as it could by sending
// other data.

// SpanReader is a stream whose next bytes can be handed out where they lie,
// span by span (package shm's Conn). fn sees memory the peer may rewrite at
// any moment; after fn fails, the rest of the n bytes are consumed without
// calling fn again and fn's first error is returned.
type SpanReader interface {
	io.Reader
	ReadSpans(n int, fn func(span []byte) error) error
}

// InPlaceMin is the least data a copy must carry to be left in place.
const InPlaceMin = 64 << 10

// copyPrefix is the size of a CopyHtoD body before its data: destination,
// stream and the data's length.
const copyPrefix = 8 + 8 + 4

// InPlace is the data of a host-to-device copy left in the stream. It must
// be taken (ReadInto, Stream or Discard) before the next frame is read;
// the FrameReader discards it itself otherwise. Whatever goes wrong while
// it is taken (the stream fails, the checksum does not match) is also
// returned by the next ReadFrame, so the connection ends as for any bad
// frame.
type InPlace struct {
	hdr    Header
	src    SpanReader
	n      int
	dst    uint64
	stream uint64
	crc    uint32 // the frame's checksum over its header and the copy's fixed fields
	want   uint32 // the checksum the frame carries
	taken  bool
	err    error // the stream failed, or the checksum did not match
}

// Len is the data's length.
func (p *InPlace) Len() int { return p.n }

// Request is the copy without its data (Data is nil).
func (p *InPlace) Request() *CopyHtoD { return &CopyHtoD{Dst: p.dst, Stream: p.stream} }

// ReadInto copies the data into dst (Len bytes), reading each byte of the
// stream once, and checks the frame's checksum over the copy.
func (p *InPlace) ReadInto(dst []byte) error {
	p.taken = true
	if len(dst) != p.n {
		return p.fail(ErrTruncated)
	}
	off := 0
	if err := p.src.ReadSpans(p.n, func(span []byte) error {
		off += copy(dst[off:], span)
		return nil
	}); err != nil {
		return p.fail(err)
	}
	if crc32.Update(p.crc, castagnoli, dst) != p.want {
		return p.fail(ErrChecksum)
	}
	return nil
}

// Stream hands fn the data span by span where it lies, with each span's
// offset in the data; fn must read a span once and decide nothing from
// its bytes. The frame's checksum is not checked (see above). fn's first
// error is returned (the rest of the data is consumed unread).
func (p *InPlace) Stream(fn func(off int, span []byte) error) error {
	p.taken = true
	off := 0
	var fnErr error
	err := p.src.ReadSpans(p.n, func(span []byte) error {
		fnErr = fn(off, span)
		off += len(span)
		return fnErr
	})
	if err != nil && err != fnErr {
		return p.fail(err)
	}
	return fnErr
}

// Discard consumes the data unread.
func (p *InPlace) Discard() error {
	if p.taken {
		return nil
	}
	p.taken = true
	if err := p.src.ReadSpans(p.n, func([]byte) error { return nil }); err != nil {
		return p.fail(err)
	}
	return nil
}

func (p *InPlace) fail(err error) error {
	if p.err == nil {
		p.err = err
	}
	return err
}

// SetSpanReader makes the reader leave large host-to-device copies' data
// in src's stream (InPlace); src must be the stream the reader reads.
func (fr *FrameReader) SetSpanReader(src SpanReader) { fr.spans = src }

// readInPlace is called with a copy frame's header in fr.buf: if its body
// is a well-formed copy of at least InPlaceMin bytes, it reads the fixed
// fields and leaves the data in the stream. ok false: nothing more was
// read, or the fixed fields were read into fr.buf after the header and the
// body is malformed (got says how much of the frame is in fr.buf).
func (fr *FrameReader) readInPlace(h Header) (f Frame, got int, ok bool, err error) {
	if fr.spans == nil || h.Op != OpCopyHtoD || h.Length < copyPrefix+InPlaceMin {
		return Frame{}, HeaderSize, false, nil
	}
	buf := fr.buf[:HeaderSize+copyPrefix]
	if _, err := io.ReadFull(fr.r, buf[HeaderSize:]); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return Frame{Header: h}, 0, false, err
	}
	fixed := buf[HeaderSize:]
	n := binary.LittleEndian.Uint32(fixed[16:])
	if uint64(n)+copyPrefix != uint64(h.Length) {
		return Frame{}, len(buf), false, nil // decoding the whole body refuses it
	}
	crc := crc32.Update(0, castagnoli, buf[:24])
	p := &InPlace{
		hdr: h, src: fr.spans, n: int(n),
		dst:    binary.LittleEndian.Uint64(fixed),
		stream: binary.LittleEndian.Uint64(fixed[8:]),
		crc:    crc32.Update(crc, castagnoli, fixed),
		want:   binary.LittleEndian.Uint32(buf[24:]),
	}
	fr.inPlace = p
	return Frame{Header: h, Payload: fixed, InPlace: p}, 0, true, nil
}

// settleInPlace takes the last frame's in-place data if nobody did and
// returns what went wrong while it was taken.
func (fr *FrameReader) settleInPlace() (Header, error) {
	p := fr.inPlace
	if p == nil {
		return Header{}, nil
	}
	fr.inPlace = nil
	p.Discard()
	return p.hdr, p.err
}

// Err says why the data could not be taken (the stream failed, or the
// frame's checksum did not match its data), or nil.
func (p *InPlace) Err() error { return p.err }
