package abi

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// spanStream is a SpanReader over a byte slice that, like a hostile
// guest, rewrites every span right after it was handed out (spans are
// shared memory: the reader must have taken what it needed by then).
type spanStream struct {
	b   []byte
	off int
}

func (s *spanStream) Read(p []byte) (int, error) {
	if s.off == len(s.b) {
		return 0, io.EOF
	}
	n := copy(p, s.b[s.off:])
	s.off += n
	return n, nil
}

func (s *spanStream) ReadSpans(n int, fn func([]byte) error) error {
	var fnErr error
	for n > 0 {
		if s.off == len(s.b) {
			return io.ErrUnexpectedEOF
		}
		k := min(n, len(s.b)-s.off, 3000)
		span := s.b[s.off : s.off+k]
		if fnErr == nil {
			fnErr = fn(span)
		}
		for i := range span {
			span[i] ^= 0xff
		}
		s.off += k
		n -= k
	}
	return fnErr
}

func copyFrame(id uint64, data []byte) []byte {
	return AppendFrame(nil, OpCopyHtoD, 0, id, (&CopyHtoD{Dst: 7, Stream: 1, Data: data}).Append(nil))
}

// TestInPlaceFrames: large copies are left in place, their fixed fields
// decoded; ReadInto yields the data and checks the checksum; data nobody
// took is skipped and the next frame reads; small copies read as usual.
func TestInPlaceFrames(t *testing.T) {
	big := bytes.Repeat([]byte{1, 2, 3}, InPlaceMin)
	var stream []byte
	stream = append(stream, copyFrame(1, big)...)
	stream = append(stream, copyFrame(2, big)...)             // left untaken
	stream = append(stream, copyFrame(3, []byte("small"))...) // read whole
	bad := copyFrame(4, big)
	bad[len(bad)-1] ^= 1 // data that does not match the checksum
	stream = append(stream, bad...)
	fr := NewFrameReader(nil, 1<<20)
	src := &spanStream{b: stream}
	fr.r = src
	fr.SetSpanReader(src)
	f, err := fr.ReadFrame()
	if err != nil || f.InPlace == nil || f.InPlace.Len() != len(big) || f.InPlace.Request().Dst != 7 || f.InPlace.Request().Stream != 1 {
		t.Fatalf("frame 1: %+v %v", f, err)
	}
	got := make([]byte, len(big))
	if err := f.InPlace.ReadInto(got); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("ReadInto: %v", err)
	}
	if f, err = fr.ReadFrame(); err != nil || f.RequestID != 2 || f.InPlace == nil {
		t.Fatalf("frame 2: %+v %v", f, err)
	}
	if f, err = fr.ReadFrame(); err != nil || f.RequestID != 3 || f.InPlace != nil || len(f.Payload) != copyPrefix+5 {
		t.Fatalf("frame 3: %+v %v", f, err)
	}
	if f, err = fr.ReadFrame(); err != nil || f.RequestID != 4 {
		t.Fatalf("frame 4: %+v %v", f, err)
	}
	if err := f.InPlace.ReadInto(got); !errors.Is(err, ErrChecksum) || f.InPlace.Err() == nil {
		t.Fatalf("garbled data: %v", err)
	}
	if _, err := fr.ReadFrame(); !errors.Is(err, ErrChecksum) {
		t.Fatalf("after garbled data: %v, want the checksum error again", err)
	}
}

// FuzzReadFrameInPlace: whatever the stream holds, a reader leaving copies
// in place returns frames or errors, never panics, hands out only the
// bytes a frame announced, and stays in step.
func FuzzReadFrameInPlace(f *testing.F) {
	f.Add(copyFrame(1, bytes.Repeat([]byte{9}, InPlaceMin+5)))
	f.Add(append(copyFrame(1, bytes.Repeat([]byte{9}, InPlaceMin)), copyFrame(2, nil)...))
	f.Add(copyFrame(1, []byte("x")))
	f.Fuzz(func(t *testing.T, data []byte) {
		src := &spanStream{b: append([]byte(nil), data...)}
		fr := NewFrameReader(src, 1<<20)
		fr.SetSpanReader(src)
		for i := 0; ; i++ {
			fm, err := fr.ReadFrame()
			if err != nil {
				return
			}
			if fm.InPlace == nil {
				continue
			}
			if int64(fm.InPlace.Len())+copyPrefix != int64(fm.Length) {
				t.Fatalf("in-place length %d for a %d-byte payload", fm.InPlace.Len(), fm.Length)
			}
			switch i % 3 {
			case 0:
				fm.InPlace.ReadInto(make([]byte, fm.InPlace.Len()))
			case 1:
				n := 0
				fm.InPlace.Stream(func(off int, span []byte) error {
					if off != n {
						t.Fatalf("span at %d, want %d", off, n)
					}
					n += len(span)
					return nil
				})
			}
		}
	})
}
