package cuapi

import "unsafe"

// hostBytes is the program's n bytes of host memory at p: memory this
// driver allocated or the program registered, outside Go's heap, which
// stays mapped while the driver records it. (The pointer is read through
// &p so that the conversion is of a pointer's bits, which no Go object
// backs and no collector moves.)
func hostBytes(p uintptr, n uint64) []byte {
	return unsafe.Slice((*byte)(*(*unsafe.Pointer)(unsafe.Pointer(&p))), n)
}
