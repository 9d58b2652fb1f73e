package abi

import "crypto/sha256"

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
