package mmioguest

import "unsafe"

// The workloads store through typed pointers into the mapped aperture, as
// a real driver does: one machine store each, which is what the tracer
// catches (a copy into the slice could be split or merged differently).

// word is the 8-byte word at mem[off:].
func word(mem []byte, off int) *uint64 { return (*uint64)(unsafe.Pointer(&mem[off])) }

// word32 is the 4-byte word at mem[off:].
func word32(mem []byte, off int) *uint32 { return (*uint32)(unsafe.Pointer(&mem[off])) }
