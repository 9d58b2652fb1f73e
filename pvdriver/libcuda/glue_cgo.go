package main

/*
#cgo CFLAGS: -O2 -Wall
#include <stdlib.h>
#include <string.h>
#include "vgcuda.h"

*/
import "C"

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"sync"
	"unsafe"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/pvdriver/cuapi"
)

// The C half's Go entries: each converts its C arguments, checks output
// pointers and sizes, and calls the driver. Handles cross as uintptr_t.

var drv = newDriver()

// newDriver is the process's driver, telling answers.c when to forget
// the answers it keeps.
func newDriver() *cuapi.Driver {
	d := cuapi.New()
	d.OnChange(func() { C.vg_answers_forget() })
	return d
}

// thread is the calling thread's context stack, kept in C thread-local
// storage (a cgo callback runs on the thread that called).
type thread struct{}

func (thread) Top() uint64        { return uint64(C.vg_ctx_top()) }
func (thread) SetTop(c uint64)    { C.vg_ctx_set_top(C.uintptr_t(c)) }
func (thread) Push(c uint64) bool { return C.vg_ctx_push(C.uintptr_t(c)) == 0 }
func (thread) Pop() uint64        { return uint64(C.vg_ctx_pop()) }
func res(r cuapi.Result) C.CUresult {
	if r != cuapi.Success && C.vg_debug_enabled() > 1 {
		traceFailure(r)
	}
	return C.CUresult(r)
}

// traceFailure names, with VGPUHA_DEBUG=2, the entry that returns r.
func traceFailure(r cuapi.Result) {
	name := "?"
	if pc, _, _, ok := runtime.Caller(2); ok {
		name = runtime.FuncForPC(pc).Name()
	}
	text, _ := r.Name()
	fmt.Fprintf(os.Stderr, "vgpuha libcuda: %s: %s (%d)\n", name, text, r)
}

var errInvalid = C.CUresult(cuapi.ErrorInvalidValue)

// hostBytes is the n bytes of host memory at p, or false when they cannot
// be addressed (nil, or a range that wraps or exceeds Go's int).
func hostBytes(p unsafe.Pointer, n C.size_t) ([]byte, bool) {
	if n == 0 {
		return nil, true
	}
	if p == nil || uint64(n) > math.MaxInt32*uint64(1<<16) || uintptr(p)+uintptr(n) < uintptr(p) {
		return nil, false
	}
	return unsafe.Slice((*byte)(p), int(n)), true
}

//export vgInit
func vgInit(flags C.uint) C.CUresult {
	startProfile()
	return res(drv.Init(uint32(flags)))
}

//export vgShutdown
func vgShutdown() {
	drv.Shutdown()
	writeTally(os.Stderr)
	stopProfile()
}

//export vgDriverGetVersion
func vgDriverGetVersion(v *C.int) C.CUresult {
	if v == nil {
		return errInvalid
	}
	*v = C.int(drv.DriverGetVersion())
	return 0
}

// outInt stores v in *p on success.
func outInt(p *C.int, v int32, r cuapi.Result) C.CUresult {
	if p == nil {
		return errInvalid
	}
	if r == cuapi.Success {
		*p = C.int(v)
	}
	return res(r)
}

// outHandle stores h in *p on success.
func outHandle(p *C.uintptr_t, h uint64, r cuapi.Result) C.CUresult {
	if p == nil {
		return errInvalid
	}
	if r == cuapi.Success {
		*p = C.uintptr_t(h)
	}
	return res(r)
}

//export vgDeviceGet
func vgDeviceGet(dev *C.CUdevice, ordinal C.int) C.CUresult {
	if dev == nil {
		return errInvalid
	}
	d, r := drv.DeviceGet(int32(ordinal))
	if r == cuapi.Success {
		*dev = C.CUdevice(d)
	}
	return res(r)
}

//export vgDeviceGetCount
func vgDeviceGetCount(n *C.int) C.CUresult { v, r := drv.DeviceGetCount(); return outInt(n, v, r) }

//export vgDeviceGetName
func vgDeviceGetName(name *C.char, n C.int, dev C.CUdevice) C.CUresult {
	if name == nil || n <= 0 {
		return errInvalid
	}
	s, r := drv.DeviceName(int32(dev))
	if r == cuapi.Success {
		buf := unsafe.Slice((*byte)(unsafe.Pointer(name)), int(n))
		buf[copy(buf[:len(buf)-1], s)] = 0
	}
	return res(r)
}

//export vgDeviceGetAttribute
func vgDeviceGetAttribute(v *C.int, attr C.int, dev C.CUdevice) C.CUresult {
	x, r := drv.DeviceAttribute(int32(attr), int32(dev))
	return outInt(v, x, r)
}

//export vgDeviceTotalMem
func vgDeviceTotalMem(n *C.size_t, dev C.CUdevice) C.CUresult {
	if n == nil {
		return errInvalid
	}
	v, r := drv.DeviceTotalMem(int32(dev))
	if r == cuapi.Success {
		*n = C.size_t(v)
	}
	return res(r)
}

//export vgDeviceGetUuid
func vgDeviceGetUuid(u *C.CUuuid, dev C.CUdevice) C.CUresult {
	if u == nil {
		return errInvalid
	}
	v, r := drv.DeviceUUID(int32(dev))
	if r == cuapi.Success {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&u.bytes[0])), 16), v[:])
	}
	return res(r)
}

//export vgDeviceCanAccessPeer
func vgDeviceCanAccessPeer(can *C.int, dev, peer C.CUdevice) C.CUresult {
	v, r := drv.DeviceCanAccessPeer(int32(dev), int32(peer))
	return outInt(can, v, r)
}

//export vgDeviceComputeCapability
func vgDeviceComputeCapability(major, minor *C.int, dev C.CUdevice) C.CUresult {
	if major == nil || minor == nil {
		return errInvalid
	}
	a, b, r := drv.DeviceComputeCapability(int32(dev))
	if r == cuapi.Success {
		*major, *minor = C.int(a), C.int(b)
	}
	return res(r)
}

//export vgCtxCreate
func vgCtxCreate(ctx *C.uintptr_t, flags C.uint, dev C.CUdevice, unsupported C.int) C.CUresult {
	if ctx == nil {
		return errInvalid
	}
	h, r := drv.CtxCreate(thread{}, uint32(flags), int32(dev), unsupported != 0)
	return outHandle(ctx, h, r)
}

//export vgCtxDestroy
func vgCtxDestroy(ctx C.uintptr_t) C.CUresult { return res(drv.CtxDestroy(thread{}, uint64(ctx))) }

//export vgCtxSetCurrent
func vgCtxSetCurrent(ctx C.uintptr_t) C.CUresult {
	return res(drv.CtxSetCurrent(thread{}, uint64(ctx)))
}

//export vgCtxGetCurrent
func vgCtxGetCurrent(ctx *C.uintptr_t) C.CUresult {
	h, r := drv.CtxGetCurrent(thread{})
	return outHandle(ctx, h, r)
}

//export vgCtxPushCurrent
func vgCtxPushCurrent(ctx C.uintptr_t) C.CUresult {
	return res(drv.CtxPushCurrent(thread{}, uint64(ctx)))
}

//export vgCtxPopCurrent
func vgCtxPopCurrent(ctx *C.uintptr_t) C.CUresult {
	h, r := drv.CtxPopCurrent(thread{})
	if ctx != nil && r == cuapi.Success {
		*ctx = C.uintptr_t(h)
	}
	return res(r)
}

//export vgCtxSynchronize
func vgCtxSynchronize() C.CUresult { return res(drv.CtxSynchronize(thread{})) }

//export vgCtxGetDevice
func vgCtxGetDevice(dev *C.CUdevice) C.CUresult {
	if dev == nil {
		return errInvalid
	}
	d, r := drv.CtxGetDevice(thread{})
	if r == cuapi.Success {
		*dev = C.CUdevice(d)
	}
	return res(r)
}

//export vgPrimaryCtxRetain
func vgPrimaryCtxRetain(ctx *C.uintptr_t, dev C.CUdevice) C.CUresult {
	if ctx == nil {
		return errInvalid
	}
	h, r := drv.PrimaryCtxRetain(int32(dev))
	return outHandle(ctx, h, r)
}

//export vgPrimaryCtxRelease
func vgPrimaryCtxRelease(dev C.CUdevice) C.CUresult { return res(drv.PrimaryCtxRelease(int32(dev))) }

//export vgPrimaryCtxReset
func vgPrimaryCtxReset(dev C.CUdevice) C.CUresult { return res(drv.PrimaryCtxReset(int32(dev))) }

//export vgGetErrorName
func vgGetErrorName(r C.CUresult, s **C.char) C.CUresult { return errorText(r, s, 0) }

//export vgGetErrorString
func vgGetErrorString(r C.CUresult, s **C.char) C.CUresult { return errorText(r, s, 1) }

// errorTexts holds every result's name and description as C strings,
// made once and never freed (programs keep the pointers).
var errorTexts = sync.OnceValue(func() map[cuapi.Result][2]*C.char {
	m := map[cuapi.Result][2]*C.char{}
	for _, r := range cuapi.Results() {
		name, _ := r.Name()
		text, _ := r.Description()
		m[r] = [2]*C.char{C.CString(name), C.CString(text)}
	}
	return m
})

func errorText(r C.CUresult, s **C.char, which int) C.CUresult {
	if s == nil {
		return errInvalid
	}
	t, ok := errorTexts()[cuapi.Result(r)]
	if !ok {
		*s = nil
		return errInvalid
	}
	*s = t[which]
	return 0
}

// maxImage bounds a module image read from memory (a cubin's or fatbin's
// headers give its size, PTX ends at its NUL): the largest the library
// uploads (pvdriver's images.go).
const maxImage = abi.MaxImage
