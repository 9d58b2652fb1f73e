package abi

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// Raw images: what NVIDIA's toolchain emits, sent as it is. nvcc's cubin
// (an ELF file for the GPU) and fatbin (a container of cubins and PTX for
// several architectures) cannot be split into kernels by the guest, and
// only the GPU's own driver can load them, so they travel whole and the
// backend that loads them says which kernels they hold and how each
// kernel's parameters are laid out (ParamSlot). The hypervisor checks the
// framing below before any backend sees the bytes; what is inside a
// section (machine code) is the GPU driver's to judge.
//
//	8 bytes  "VGMOD\x00\x00\x02"
//	u8       format (FormatCubin or FormatFatbin)
//	bytes    the image

var rawImageMagic = [8]byte{'V', 'G', 'M', 'O', 'D', 0, 0, 2}

// ImageFormat says what a raw module image holds.
type ImageFormat uint8

// Raw image formats. Zero is a kernel list (the VGMOD v1 image).
const (
	FormatKernels ImageFormat = iota
	FormatCubin
	FormatFatbin
)

func (f ImageFormat) String() string {
	switch f {
	case FormatKernels:
		return "kernel list"
	case FormatCubin:
		return "cubin"
	case FormatFatbin:
		return "fatbin"
	}
	return fmt.Sprintf("format %d", uint8(f))
}

// ParamSlot is where one kernel parameter lives in the parameter buffer.
type ParamSlot struct{ Offset, Size uint32 }

// RawImage wraps a cubin or fatbin for OpModuleLoad, after checking its
// framing.
func RawImage(format ImageFormat, image []byte) ([]byte, error) {
	if err := checkRaw(format, image); err != nil {
		return nil, err
	}
	return (&ModuleImage{Format: format, Raw: image}).Append(nil), nil
}

// decodeRawImage decodes a raw image; owned: b is the caller's to hand
// over (an upload's buffer, up to MaxImage), else b is a frame's, up to
// MaxModuleImage, and the image is copied out of it.
func decodeRawImage(b []byte, owned bool) (*ModuleImage, error) {
	d := Decoder{b: b[len(rawImageMagic):]}
	format := ImageFormat(d.U8())
	image := d.Bytes(MaxImage)
	if !owned {
		if len(image) > MaxModuleImage {
			return nil, fmt.Errorf("%w: a %d-byte image in one request (at most %d; larger ones are uploaded in pieces)", ErrBadImage, len(image), MaxModuleImage)
		}
		image = bytes.Clone(image) // kept with the module: never an alias of a reused frame buffer
	}
	if err := d.Finish(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadImage, err)
	}
	if err := checkRaw(format, image); err != nil {
		return nil, err
	}
	return &ModuleImage{Format: format, Raw: image}, nil
}

func checkRaw(format ImageFormat, image []byte) error {
	switch format {
	case FormatCubin:
		return CheckCubin(image)
	case FormatFatbin:
		return CheckFatbin(image)
	}
	return fmt.Errorf("%w: raw image of %v", ErrBadImage, format)
}

// ELF constants for a cubin (elf.h; EM_CUDA is 190).
const (
	elfHeaderSize  = 64
	elfSectionSize = 64
	emCUDA         = 190
	shtNobits      = 8
)

// CheckCubin checks that b is a 64-bit little-endian ELF file for a CUDA
// GPU whose section headers and sections all lie inside b.
func CheckCubin(b []byte) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: cubin: %s", ErrBadImage, fmt.Sprintf(format, args...))
	}
	if len(b) < elfHeaderSize || string(b[:4]) != "\x7fELF" {
		return bad("not an ELF file")
	}
	if b[4] != 2 || b[5] != 1 {
		return bad("not 64-bit little-endian ELF")
	}
	le := binary.LittleEndian
	if m := le.Uint16(b[18:]); m != emCUDA {
		return bad("machine %d, not a CUDA GPU (%d)", m, emCUDA)
	}
	shoff, shentsize, shnum := le.Uint64(b[40:]), uint64(le.Uint16(b[58:])), uint64(le.Uint16(b[60:]))
	if shnum == 0 {
		return bad("no sections")
	}
	if shentsize != elfSectionSize {
		return bad("section header size %d", shentsize)
	}
	if shoff > uint64(len(b)) || shnum*shentsize > uint64(len(b))-shoff {
		return bad("%d section headers at %d lie outside its %d bytes", shnum, shoff, len(b))
	}
	if idx := uint64(le.Uint16(b[62:])); idx >= shnum {
		return bad("section name table %d of %d", idx, shnum)
	}
	for i := range shnum {
		sh := b[shoff+i*shentsize:]
		typ, off, size := le.Uint32(sh[4:]), le.Uint64(sh[24:]), le.Uint64(sh[32:])
		if typ != shtNobits && (off > uint64(len(b)) || size > uint64(len(b))-off) {
			return bad("section %d (%d bytes at %d) lies outside its %d bytes", i, size, off, len(b))
		}
	}
	return nil
}

// Fatbin framing (fatbinary_section.h and what nvcc emits): a 16-byte
// header (magic, version 1, header size 16, size of what follows), then
// entries back to back, each a header of at least 16 bytes (kind, flags,
// its header size, payload size, ...) followed by its payload.
const (
	FatbinMagic      = 0xBA55ED50
	fatbinHeaderSize = 16
	fatbinEntryMin   = 16
	maxFatbinEntries = 4096
)

// CheckFatbin checks that b is exactly one fatbin container whose entries
// tile it without gaps or overruns.
func CheckFatbin(b []byte) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: fatbin: %s", ErrBadImage, fmt.Sprintf(format, args...))
	}
	le := binary.LittleEndian
	if len(b) < fatbinHeaderSize || le.Uint32(b) != FatbinMagic {
		return bad("no fatbin header")
	}
	if v, h := le.Uint16(b[4:]), le.Uint16(b[6:]); v != 1 || h != fatbinHeaderSize {
		return bad("version %d, header size %d (want 1, %d)", v, h, fatbinHeaderSize)
	}
	if size := le.Uint64(b[8:]); size != uint64(len(b)-fatbinHeaderSize) {
		return bad("header says %d bytes follow, image has %d", size, len(b)-fatbinHeaderSize)
	}
	n, err := FatbinEntries(b, nil)
	if err != nil {
		return bad("%v", err)
	}
	if n == 0 {
		return bad("no entries")
	}
	return nil
}

// Fatbin entry kinds (fatbinary_section.h).
const (
	FatbinPTX   = 1
	FatbinCubin = 2
)

// FatbinEntries walks the entries of a fatbin whose header CheckFatbin
// accepted, calling fn (if set) with each one's kind and payload, and
// returns how many there are, or where one overruns the container.
func FatbinEntries(b []byte, fn func(kind uint16, payload []byte)) (int, error) {
	le := binary.LittleEndian
	end := uint64(len(b))
	off, n := uint64(fatbinHeaderSize), 0
	for ; off < end; n++ {
		if n == maxFatbinEntries {
			return n, fmt.Errorf("more than %d entries", maxFatbinEntries)
		}
		if end-off < fatbinEntryMin {
			return n, fmt.Errorf("entry %d: %d bytes left, an entry header needs %d", n, end-off, fatbinEntryMin)
		}
		e := b[off:]
		kind, hdr, payload := le.Uint16(e), uint64(le.Uint32(e[4:])), le.Uint64(e[8:])
		if kind == 0 || hdr < fatbinEntryMin || hdr > end-off || payload > end-off-hdr {
			return n, fmt.Errorf("entry %d at %d: kind %d, header %d, payload %d overrun the %d bytes", n, off, kind, hdr, payload, end)
		}
		if fn != nil {
			fn(kind, b[off+hdr:off+hdr+payload])
		}
		off += hdr + payload
	}
	return n, nil
}

// CheckSlots checks a parameter layout: each slot non-empty, in order,
// not overlapping the one before, all inside MaxParamBytes.
func CheckSlots(slots []ParamSlot) error {
	if len(slots) > MaxArgs {
		return fmt.Errorf("%w: %d parameters, limit %d", ErrBadArgument, len(slots), MaxArgs)
	}
	var end uint64
	for i, p := range slots {
		if p.Size == 0 || uint64(p.Offset) < end || uint64(p.Offset)+uint64(p.Size) > MaxParamBytes {
			return fmt.Errorf("%w: parameter %d: %d bytes at %d (previous end %d, limit %d)",
				ErrBadArgument, i, p.Size, p.Offset, end, MaxParamBytes)
		}
		end = uint64(p.Offset) + uint64(p.Size)
	}
	return nil
}
