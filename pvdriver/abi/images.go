package abi

import (
	"crypto/sha256"
	"fmt"
)

// Module images by content. A framework registers hundreds of megabytes of
// fatbins, the same ones in every process; a guest names an image by the
// SHA-256 of its encoded bytes (ImageHash) first and sends the bytes only
// when the node answers StatusUnknownImage.

// ImageHash names a module image (the body of OpModuleLoad) by content.
type ImageHash [sha256.Size]byte

// HashImage returns the hash OpModuleLoadCached names image by.
func HashImage(image []byte) ImageHash { return sha256.Sum256(image) }

// ModuleLoadCached loads the image whose encoded bytes hash to Hash.
type ModuleLoadCached struct{ Hash ImageHash }

func (m *ModuleLoadCached) Append(b []byte) []byte { return append(b, m.Hash[:]...) }
func (m *ModuleLoadCached) decode(d *Decoder)      { copy(m.Hash[:], d.take(len(m.Hash))) }

// Images too large for one frame. A module image of more than what one
// frame carries (MaxModuleImage, or less under a smaller payload limit)
// is uploaded in pieces (OpImageStage) into the guest's session, in order,
// and then loaded by hash (OpModuleLoadCached) like an image the node
// already holds. MaxImage bounds such an image: NVIDIA's largest fatbins
// (cuRAND's precomputed tables, cuFFT's and cuDNN's kernel sets, NCCL's
// 56 MiB) run to a few hundred MiB; a node holds each upload whole (one
// copy) until it is loaded, and a bound of 1 GiB keeps that, its SHA-256
// (about a second) and a length the C glue reads in one call (an int)
// well inside what one guest may ask of a node.
const MaxImage = 1 << 30

// ImageStage is one piece of an image upload: Data goes at Offset of the
// Total encoded bytes (an OpModuleLoad body, as HashImage hashes it) that
// hash to Hash. Pieces come in order, without gaps or overlaps; a piece at
// Offset 0 starts the upload afresh (a guest that restarts one). The node
// checks the hash when the last piece lands.
type ImageStage struct {
	Hash   ImageHash
	Total  uint64
	Offset uint64
	Data   []byte
}

// imageStageHeader bounds the encoding of an ImageStage without its data.
const imageStageHeader = len(ImageHash{}) + 8 + 8 + 4

func (m *ImageStage) Append(b []byte) []byte {
	b = append(b, m.Hash[:]...)
	b = appendU64(appendU64(b, m.Total), m.Offset)
	return appendBytes(b, m.Data)
}

func (m *ImageStage) decode(d *Decoder) {
	copy(m.Hash[:], d.take(len(m.Hash)))
	m.Total, m.Offset = d.U64(), d.U64()
	m.Data = d.Bytes(MaxImage) // and the frame's limit
	if d.err != nil {
		return
	}
	if err := m.Check(); err != nil {
		d.fail(err)
	}
}

// Check refuses a piece whose place lies outside a bounded image: an
// empty piece, a total of zero or over MaxImage, a piece past the total
// (overflow-checked).
func (m *ImageStage) Check() error {
	switch {
	case m.Total == 0 || m.Total > MaxImage:
		return fmt.Errorf("%w: an image of %d bytes (1 to %d)", ErrBadArgument, m.Total, MaxImage)
	case len(m.Data) == 0 || m.Offset > m.Total || uint64(len(m.Data)) > m.Total-m.Offset:
		return fmt.Errorf("%w: %d bytes at %d of a %d-byte image", ErrBadArgument, len(m.Data), m.Offset, m.Total)
	}
	return nil
}

// ImageStageSize is the size of an ImageStage with n bytes of data.
func ImageStageSize(n int) int { return imageStageHeader + n }
