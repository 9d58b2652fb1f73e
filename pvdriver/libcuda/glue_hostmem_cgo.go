package main

/*
#include "vgcuda.h"
*/
import "C"

import "unsafe"

// The Go entries of host memory the program registers
// (pvdriver/cuapi/hostmem.go; the C entries are in exports_hostmem.c).

//export vgMemHostRegister
func vgMemHostRegister(p unsafe.Pointer, n C.size_t, flags C.uint) C.CUresult {
	return res(drv.HostRegister(thread{}, uintptr(p), uint64(n), uint32(flags)))
}

//export vgMemHostGetDevicePointer
func vgMemHostGetDevicePointer(out *C.uintptr_t, p unsafe.Pointer, flags C.uint) C.CUresult {
	if out == nil {
		return errInvalid
	}
	dev, r := drv.HostGetDevicePointer(thread{}, uintptr(p), uint32(flags))
	return outHandle(out, dev, r)
}

//export vgMemHostUnregister
func vgMemHostUnregister(p unsafe.Pointer) C.CUresult {
	return res(drv.HostUnregister(uintptr(p)))
}
