package abi

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
)

// A module image is what a guest loads with OpModuleLoad: a list of kernels,
// each with its parameter signature and the PTX text that defines it (an
// .entry of the same name). Declaring the signature lets the hypervisor
// check every launch's arguments before any backend sees them, and tells the
// replication layer which arguments are device pointers.
//
//	8 bytes  "VGMOD\x00\x00\x01"
//	u16      kernel count (1..MaxKernels)
//	per kernel: string name, u16 param count, param kinds (u8 each), bytes PTX

var imageMagic = [8]byte{'V', 'G', 'M', 'O', 'D', 0, 0, 1}

// MaxKernels bounds the kernels in one module image.
const MaxKernels = 64

// ErrBadImage reports a malformed module image.
var ErrBadImage = errors.New("abi: malformed module image")

// KernelSpec declares one kernel of a module image. A raw image's kernel
// has no PTX: its parameters are bytes in the slots the backend reported.
type KernelSpec struct {
	Name   string
	Params []ArgKind
	PTX    string
	Slots  []ParamSlot
}

// ModuleImage is a decoded module image: a kernel list, or a raw image
// (Format cubin or fatbin, the bytes in Raw, no Kernels: the backend that
// loads it names them).
type ModuleImage struct {
	Kernels []KernelSpec
	Format  ImageFormat
	Raw     []byte
}

// Kernel returns the kernel called name, if the image declares one.
func (m *ModuleImage) Kernel(name string) (KernelSpec, bool) {
	for _, k := range m.Kernels {
		if k.Name == name {
			return k, true
		}
	}
	return KernelSpec{}, false
}

// Append encodes the image.
func (m *ModuleImage) Append(b []byte) []byte {
	if m.Format != FormatKernels {
		b = append(b, rawImageMagic[:]...)
		return appendBytes(append(b, byte(m.Format)), m.Raw)
	}
	b = append(b, imageMagic[:]...)
	b = appendU16(b, uint16(len(m.Kernels)))
	for _, k := range m.Kernels {
		b = appendString(b, k.Name)
		b = appendU16(b, uint16(len(k.Params)))
		for _, p := range k.Params {
			b = append(b, byte(p))
		}
		b = appendBytes(b, []byte(k.PTX))
	}
	return b
}

// EncodedSize is the size of the image's encoding (Append).
func (m *ModuleImage) EncodedSize() int {
	if m.Format != FormatKernels {
		return len(rawImageMagic) + 1 + 4 + len(m.Raw)
	}
	return len(m.Append(nil))
}

// Pieces calls fn with the image's encoding (Append) in pieces of at most
// n bytes, in order, each at its offset; fn must not keep a piece. A raw
// image's pieces are its own bytes, not a copy of the whole encoding.
func (m *ModuleImage) Pieces(n int, fn func(off int, piece []byte)) {
	if m.Format == FormatKernels {
		enc := m.Append(nil)
		for off := 0; off < len(enc); off += n {
			fn(off, enc[off:min(off+n, len(enc))])
		}
		return
	}
	head := append(append([]byte(nil), rawImageMagic[:]...), byte(m.Format)) // as Append writes it
	head = binary.LittleEndian.AppendUint32(head, uint32(len(m.Raw)))
	total := len(head) + len(m.Raw)
	for off := 0; off < total; off += n {
		end := min(off+n, total)
		if off >= len(head) {
			fn(off, m.Raw[off-len(head):end-len(head)])
			continue
		}
		first := append(append([]byte(nil), head[off:min(end, len(head))]...), m.Raw[:max(end-len(head), 0)]...)
		fn(off, first)
	}
}

// Hash is HashImage of the image's encoding, taken piece by piece.
func (m *ModuleImage) Hash() ImageHash {
	sum := sha256.New()
	m.Pieces(1<<20, func(_ int, p []byte) { sum.Write(p) })
	return ImageHash(sum.Sum(nil))
}

// DecodeModuleImage parses and checks a module image of at most
// MaxModuleImage bytes (one frame's); the result aliases nothing of b.
func DecodeModuleImage(b []byte) (*ModuleImage, error) { return decodeModuleImage(b, false) }

// DecodeOwnedModuleImage parses and checks a module image of at most
// MaxImage bytes (an upload's, in pieces) that the caller hands over: a
// raw image's bytes alias b, which nobody may change afterwards.
func DecodeOwnedModuleImage(b []byte) (*ModuleImage, error) { return decodeModuleImage(b, true) }

func decodeModuleImage(b []byte, owned bool) (*ModuleImage, error) {
	if len(b) >= len(rawImageMagic) && string(b[:len(rawImageMagic)]) == string(rawImageMagic[:]) {
		return decodeRawImage(b, owned)
	}
	limit := MaxModuleImage // one frame's, or an upload's
	if owned {
		limit = MaxImage
	}
	d := Decoder{b: b}
	magic := d.take(len(imageMagic))
	if d.err != nil || string(magic) != string(imageMagic[:]) {
		return nil, fmt.Errorf("%w: bad magic", ErrBadImage)
	}
	n := int(d.U16())
	if d.err == nil && (n == 0 || n > MaxKernels) {
		return nil, fmt.Errorf("%w: %d kernels (want 1..%d)", ErrBadImage, n, MaxKernels)
	}
	m := &ModuleImage{}
	seen := map[string]bool{}
	for i := 0; i < n && d.err == nil; i++ {
		k := KernelSpec{Name: d.String(MaxKernelName)}
		np := int(d.U16())
		if np > MaxArgs {
			return nil, fmt.Errorf("%w: kernel %q declares %d params, limit %d", ErrBadImage, k.Name, np, MaxArgs)
		}
		for j := 0; j < np && d.err == nil; j++ {
			kind := ArgKind(d.U8())
			if kind == ArgInvalid || kind > ArgBytes {
				return nil, fmt.Errorf("%w: kernel %q param %d has kind %d", ErrBadImage, k.Name, j, kind)
			}
			k.Params = append(k.Params, kind)
		}
		k.PTX = string(d.Bytes(limit))
		if d.err != nil {
			break
		}
		if k.Name == "" || seen[k.Name] {
			return nil, fmt.Errorf("%w: empty or repeated kernel name %q", ErrBadImage, k.Name)
		}
		seen[k.Name] = true
		m.Kernels = append(m.Kernels, k)
	}
	if err := d.Finish(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadImage, err)
	}
	return m, nil
}

func appendU16(b []byte, v uint16) []byte { return append(b, byte(v), byte(v>>8)) }
