package abi

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// testCubin is the smallest image CheckCubin accepts: an ELF header for a
// CUDA GPU, a null section and one section holding four bytes.
func testCubin() []byte {
	le := binary.LittleEndian
	b := make([]byte, elfHeaderSize+4+2*elfSectionSize)
	copy(b, "\x7fELF\x02\x01\x01")
	le.PutUint16(b[18:], emCUDA)
	le.PutUint64(b[40:], elfHeaderSize+4) // section headers after the data
	le.PutUint16(b[58:], elfSectionSize)
	le.PutUint16(b[60:], 2)
	le.PutUint16(b[62:], 1)
	sh := b[elfHeaderSize+4+elfSectionSize:]
	le.PutUint32(sh[4:], 3) // SHT_STRTAB
	le.PutUint64(sh[24:], elfHeaderSize)
	le.PutUint64(sh[32:], 4)
	return b
}

// testFatbin is a container of two entries, each a 64-byte header and a
// payload.
func testFatbin(payloads ...[]byte) []byte {
	le := binary.LittleEndian
	b := make([]byte, fatbinHeaderSize)
	le.PutUint32(b, FatbinMagic)
	le.PutUint16(b[4:], 1)
	le.PutUint16(b[6:], fatbinHeaderSize)
	for i, p := range payloads {
		e := make([]byte, 64)
		le.PutUint16(e, uint16(1+i%2)) // PTX, ELF
		le.PutUint32(e[4:], 64)
		le.PutUint64(e[8:], uint64(len(p)))
		b = append(append(b, e...), p...)
	}
	le.PutUint64(b[8:], uint64(len(b)-fatbinHeaderSize))
	return b
}

func TestRawImagesRoundTrip(t *testing.T) {
	for _, c := range []struct {
		format ImageFormat
		image  []byte
	}{{FormatCubin, testCubin()}, {FormatFatbin, testFatbin([]byte("ptx text"), testCubin())}} {
		wire, err := RawImage(c.format, c.image)
		if err != nil {
			t.Fatalf("%v: %v", c.format, err)
		}
		m, err := DecodeModuleImage(wire)
		if err != nil {
			t.Fatalf("%v: %v", c.format, err)
		}
		if m.Format != c.format || !bytes.Equal(m.Raw, c.image) || len(m.Kernels) != 0 {
			t.Fatalf("%v: decoded %v, %d bytes, %d kernels", c.format, m.Format, len(m.Raw), len(m.Kernels))
		}
	}
}

// TestRawImageFramingRefused: every framing fault is refused before a
// backend sees the image, naming what is wrong.
func TestRawImageFramingRefused(t *testing.T) {
	le := binary.LittleEndian
	edit := func(b []byte, f func([]byte)) []byte { b = bytes.Clone(b); f(b); return b }
	cases := []struct {
		name   string
		format ImageFormat
		image  []byte
	}{
		{"cubin truncated", FormatCubin, testCubin()[:60]},
		{"cubin for x86", FormatCubin, edit(testCubin(), func(b []byte) { le.PutUint16(b[18:], 62) })},
		{"cubin 32-bit", FormatCubin, edit(testCubin(), func(b []byte) { b[4] = 1 })},
		{"cubin section headers past the end", FormatCubin, edit(testCubin(), func(b []byte) { le.PutUint16(b[60:], 3) })},
		{"cubin section header offset overflows", FormatCubin, edit(testCubin(), func(b []byte) { le.PutUint64(b[40:], 1<<63) })},
		{"cubin section past the end", FormatCubin, edit(testCubin(), func(b []byte) {
			le.PutUint64(b[elfHeaderSize+4+elfSectionSize+32:], 1<<40)
		})},
		{"cubin name table index", FormatCubin, edit(testCubin(), func(b []byte) { le.PutUint16(b[62:], 2) })},
		{"fatbin bad magic", FormatFatbin, edit(testFatbin([]byte("x")), func(b []byte) { b[0] ^= 1 })},
		{"fatbin size disagrees", FormatFatbin, append(testFatbin([]byte("x")), 0)},
		{"fatbin entry overruns", FormatFatbin, edit(testFatbin([]byte("x")), func(b []byte) { le.PutUint64(b[16+8:], 2) })},
		{"fatbin entry header too small", FormatFatbin, edit(testFatbin([]byte("x")), func(b []byte) { le.PutUint32(b[16+4:], 8) })},
		{"fatbin entry payload overflows", FormatFatbin, edit(testFatbin([]byte("x")), func(b []byte) { le.PutUint64(b[16+8:], ^uint64(0)) })},
		{"fatbin without entries", FormatFatbin, testFatbin()},
		{"kernel list as raw", FormatKernels, []byte("x")},
	}
	for _, c := range cases {
		if _, err := RawImage(c.format, c.image); !errors.Is(err, ErrBadImage) {
			t.Errorf("%s: RawImage gave %v, want ErrBadImage", c.name, err)
		}
		wire := (&ModuleImage{Format: c.format, Raw: c.image}).Append(nil)
		if c.format == FormatKernels {
			continue // encodes as a (malformed) kernel list
		}
		if _, err := DecodeModuleImage(wire); !errors.Is(err, ErrBadImage) {
			t.Errorf("%s: DecodeModuleImage gave %v, want ErrBadImage", c.name, err)
		}
	}
}

func TestCheckSlots(t *testing.T) {
	good := []ParamSlot{{0, 8}, {8, 4}, {16, 16}}
	if err := CheckSlots(good); err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][]ParamSlot{
		{{0, 0}},                   // empty
		{{0, 8}, {4, 4}},           // overlaps
		{{MaxParamBytes - 4, 8}},   // past the limit
		{{^uint32(0), ^uint32(0)}}, // overflows 32 bits
	} {
		if err := CheckSlots(bad); err == nil {
			t.Errorf("CheckSlots(%v) accepted", bad)
		}
	}
}

// FuzzRawImage: the framing checks never panic, and whatever they accept
// lies inside the image.
func FuzzRawImage(f *testing.F) {
	f.Add(uint8(FormatCubin), testCubin())
	f.Add(uint8(FormatFatbin), testFatbin([]byte("a"), []byte("bc")))
	f.Fuzz(func(t *testing.T, format uint8, image []byte) {
		wire, err := RawImage(ImageFormat(format), image)
		if err != nil {
			return
		}
		m, err := DecodeModuleImage(wire)
		if err != nil || !bytes.Equal(m.Raw, image) {
			t.Fatalf("accepted image does not decode back: %v", err)
		}
	})
}

// TestImagePieces: an image's pieces put together are its encoding, at
// any piece size, raw or a kernel list, and its Hash is HashImage's.
func TestImagePieces(t *testing.T) {
	raw := &ModuleImage{Format: FormatFatbin, Raw: bytes.Repeat([]byte("fatbin"), 1000)}
	list := &ModuleImage{Kernels: []KernelSpec{{Name: "k", Params: []ArgKind{ArgPtr}, PTX: "ptx"}}}
	for _, img := range []*ModuleImage{raw, list} {
		want := img.Append(nil)
		if img.EncodedSize() != len(want) || img.Hash() != HashImage(want) {
			t.Fatalf("%v: size %d, want %d; or its hash differs", img.Format, img.EncodedSize(), len(want))
		}
		for _, n := range []int{1, 5, 13, 14, 4096, 1 << 20} {
			var got []byte
			img.Pieces(n, func(off int, p []byte) {
				if off != len(got) || len(p) == 0 || len(p) > n {
					t.Fatalf("%v in pieces of %d: %d bytes at %d after %d", img.Format, n, len(p), off, len(got))
				}
				got = append(got, p...)
			})
			if !bytes.Equal(got, want) {
				t.Fatalf("%v in pieces of %d: not its encoding", img.Format, n)
			}
		}
	}
}
