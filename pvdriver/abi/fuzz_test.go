package abi

import (
	"bytes"
	"testing"
)

// FuzzReadFrame feeds arbitrary byte streams to the frame reader: it must
// return frames or errors, never panic, and every frame it accepts must
// re-encode to the same bytes.
func FuzzReadFrame(f *testing.F) {
	for op, req := range sampleRequests() {
		f.Add(AppendFrame(nil, op, 0, 1, req.Append(nil)))
	}
	f.Add([]byte("VGPU"))
	f.Add(make([]byte, HeaderSize))
	f.Fuzz(func(t *testing.T, data []byte) {
		fr := NewFrameReader(bytes.NewReader(data), 1<<16)
		for {
			fm, err := fr.ReadFrame()
			if err != nil {
				return
			}
			again := AppendFrame(nil, fm.Op, fm.Flags, fm.RequestID, fm.Payload)
			if fm.Version == Version && !bytes.Contains(data, again) {
				t.Fatalf("accepted frame does not re-encode to its input")
			}
		}
	})
}

// FuzzDecodeRequest feeds arbitrary bodies to every request decoder; an
// accepted body must re-encode to exactly the input.
func FuzzDecodeRequest(f *testing.F) {
	for op, req := range sampleRequests() {
		f.Add(uint16(op), req.Append(nil))
	}
	f.Add(uint16(OpHello), (&Hello{GuestName: "g", GPU: "GPU-abcd0001"}).Append(nil))
	f.Add(uint16(OpHello), (&Hello{GuestName: "g", Resume: 2, Token: make([]byte, ResumeTokenSize), GPU: "0"}).Append(nil))
	f.Add(uint16(OpStatusHello), (&StatusHello{GuestName: "nvml", GPU: "3"}).Append(nil))
	f.Fuzz(func(t *testing.T, op uint16, body []byte) {
		m, err := DecodeRequest(Opcode(op), body)
		if err != nil {
			return
		}
		if got := m.Append(nil); !bytes.Equal(got, body) {
			t.Fatalf("%s: re-encoded %x, input %x", Opcode(op), got, body)
		}
	})
}

// FuzzModuleImage feeds arbitrary bytes to the module image decoder.
func FuzzModuleImage(f *testing.F) {
	f.Add((&ModuleImage{Kernels: []KernelSpec{{Name: "k", Params: []ArgKind{ArgPtr}, PTX: "x"}}}).Append(nil))
	f.Add((&ModuleImage{Format: FormatCubin, Raw: []byte("\x7fELF")}).Append(nil))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := DecodeModuleImage(data)
		owned, ownedErr := DecodeOwnedModuleImage(bytes.Clone(data))
		if (err == nil) != (ownedErr == nil) && len(data) <= MaxModuleImage {
			t.Fatalf("an image of one frame: decoded %v, handed over %v", err, ownedErr)
		}
		if ownedErr == nil && !bytes.Equal(owned.Append(nil), data) {
			t.Fatal("accepted image (handed over) does not re-encode to its input")
		}
		if err != nil {
			return
		}
		if !bytes.Equal(m.Append(nil), data) {
			t.Fatal("accepted image does not re-encode to its input")
		}
	})
}

// FuzzImageStage feeds arbitrary bodies to the image piece decoder: an
// accepted piece lies inside its announced image, which is at most
// MaxImage bytes, and re-encodes to its input.
func FuzzImageStage(f *testing.F) {
	f.Add((&ImageStage{Total: 10, Offset: 4, Data: []byte("abcdef")}).Append(nil))
	f.Add((&ImageStage{Total: MaxImage, Offset: MaxImage - 1, Data: []byte("z")}).Append(nil))
	f.Add((&ImageStage{Total: 4, Offset: ^uint64(0) - 1, Data: []byte("wrap")}).Append(nil))
	f.Fuzz(func(t *testing.T, body []byte) {
		var m ImageStage
		if err := Unmarshal(body, &m); err != nil {
			return
		}
		if m.Total == 0 || m.Total > MaxImage || len(m.Data) == 0 || m.Offset+uint64(len(m.Data)) > m.Total || m.Offset > m.Total {
			t.Fatalf("accepted a piece of %d bytes at %d of %d", len(m.Data), m.Offset, m.Total)
		}
		if !bytes.Equal(m.Append(nil), body) {
			t.Fatal("accepted piece does not re-encode to its input")
		}
	})
}
