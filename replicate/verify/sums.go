package verify

import (
	"fmt"
	"hash/crc64"
)

// ObjectKind names what an ObjectSum describes.
type ObjectKind uint8

// Object kinds compared by verify.
const (
	ObjMemory ObjectKind = 1 + iota
	ObjModule
	ObjFunction
	ObjStream
	ObjSession
	// ObjAperture is one node's byte comparison of an aperture's device
	// copy with the guest's file (verify --apertures): ID is the
	// aperture's device address, Size the mismatched bytes, Sum the first
	// mismatched offset (NoMismatch when none).
	ObjAperture
	// ObjReservation is a range of a session's window reserved without
	// memory (CUDA's cuMemAddressReserve): ID its address, Size its size.
	ObjReservation
	// ObjUpload is a module image a session is uploading in pieces: ID the
	// first 8 bytes of its hash, Size the bytes uploaded so far, Sum
	// their checksum.
	ObjUpload
)

// NoMismatch is an ObjAperture's Sum when every byte matched.
const NoMismatch = ^uint64(0)

func (k ObjectKind) String() string {
	switch k {
	case ObjMemory:
		return "memory"
	case ObjModule:
		return "module"
	case ObjFunction:
		return "function"
	case ObjStream:
		return "stream"
	case ObjSession:
		return "session"
	case ObjAperture:
		return "aperture"
	case ObjReservation:
		return "reservation"
	case ObjUpload:
		return "upload"
	}
	return fmt.Sprintf("kind(%d)", k)
}

// ObjectSum is one object's checksum at a log position. For memory, ID is
// the guest device address and Sum the content checksum gpu.Checksum defines
// (a position-weighted sum of 64-bit words); for handles, ID
// is the guest handle and Sum describes what it refers to (a module's image,
// a function's module and name).
type ObjectSum struct {
	Session uint64     `json:"session"`
	Kind    ObjectKind `json:"kind"`
	ID      uint64     `json:"id"`
	Size    uint64     `json:"size"`
	Sum     uint64     `json:"sum"`
}

var crcTable = crc64.MakeTable(crc64.ECMA)

// Checksum is the content checksum verify uses.
func Checksum(b []byte) uint64 { return crc64.Checksum(b, crcTable) }

// Checksummer takes Checksum of bytes that come in pieces (a large
// module image, without a copy of it whole).
type Checksummer struct{ sum uint64 }

// Write adds p, the next bytes.
func (c *Checksummer) Write(p []byte) { c.sum = crc64.Update(c.sum, crcTable, p) }

// Sum is Checksum of every byte written.
func (c *Checksummer) Sum() uint64 { return c.sum }

// DiffBytes compares want (an aperture's file) with got (a device copy of
// it) and returns how many bytes differ and the first offset that does
// (NoMismatch when none).
func DiffBytes(want, got []byte) (mismatched, first uint64) {
	first = NoMismatch
	n := min(len(want), len(got))
	for lo := 0; lo < n; lo += 4096 {
		hi := min(lo+4096, n)
		if string(want[lo:hi]) == string(got[lo:hi]) { // memcmp: most pages match
			continue
		}
		for k := lo; k < hi; k++ {
			if want[k] != got[k] {
				mismatched++
				first = min(first, uint64(k))
			}
		}
	}
	if len(want) != len(got) {
		mismatched += uint64(max(len(want), len(got)) - n)
		first = min(first, uint64(n))
	}
	return mismatched, first
}

// ApertureSum is one node's comparison of the aperture at ptr as verify
// carries it: mismatched bytes, and the first mismatched offset.
func ApertureSum(session, ptr, mismatched, first uint64) ObjectSum {
	return ObjectSum{Session: session, Kind: ObjAperture, ID: ptr, Size: mismatched, Sum: first}
}
