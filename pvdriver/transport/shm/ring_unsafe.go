package shm

import (
	"errors"
	"sync/atomic"
	"unsafe"
)

// The area's control words are read and written with atomic operations in
// place. These two helpers are the package's only use of unsafe: they turn
// an aligned offset of a mapped control block into a pointer to the word
// there. The block outlives every pointer taken from it (a Conn unmaps its
// area only once no Read or Write is running).

var errAlign = errors.New("shm: control block is not 8-byte aligned")

func word64(b []byte, off int) (*atomic.Uint64, error) {
	p := unsafe.Pointer(&b[off : off+8][0])
	if uintptr(p)%8 != 0 {
		return nil, errAlign
	}
	return (*atomic.Uint64)(p), nil
}

func word32(b []byte, off int) (*atomic.Uint32, error) {
	p := unsafe.Pointer(&b[off : off+4][0])
	if uintptr(p)%4 != 0 {
		return nil, errAlign
	}
	return (*atomic.Uint32)(p), nil
}
