package faultcount

import "unsafe"

// addrOf is the address of b's first byte (b is an mmap: it never moves).
func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }
