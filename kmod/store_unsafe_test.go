//go:build linux

package kmod

import "unsafe"

// store writes v's low width bytes at b[off] with one store instruction
// of that width (MOV).
//
//go:noinline
func store(b []byte, off, width int, v uint64) {
	p := unsafe.Pointer(&b[off])
	switch width {
	case 1:
		*(*uint8)(p) = uint8(v)
	case 2:
		*(*uint16)(p) = uint16(v)
	case 4:
		*(*uint32)(p) = uint32(v)
	case 8:
		*(*uint64)(p) = v
	}
}
