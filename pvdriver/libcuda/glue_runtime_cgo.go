package main

/*
#include <stdlib.h>
#include "vgcuda.h"
*/
import "C"

import (
	"sync"
	"unsafe"

	"github.com/vgpuha/vgpuha/pvdriver/cuapi"
)

// The Go entries of what the CUDA runtime and the libraries over it ask of
// the driver (pvdriver/cuapi/runtime.go) and of the export tables'
// slots that need the driver (darkapi.c).

//export vgIntegrityAnswer
func vgIntegrityAnswer(version C.uint, unixSeconds C.ulonglong, pid, thread C.uint, runtimeTable, integrityTable, checkFunc C.uintptr_t, out *C.uchar) C.CUresult {
	if out == nil {
		return errInvalid
	}
	devices, r := deviceIdentities()
	if r != cuapi.Success {
		return res(r)
	}
	answer := cuapi.IntegrityAnswer(cuapi.IntegrityInput{
		DriverVersion: uint32(drv.DriverGetVersion()), RuntimeVersion: uint32(version),
		Process: uint32(pid), Thread: uint32(thread),
		RuntimeTable: uint64(runtimeTable), IntegrityTable: uint64(integrityTable), CheckFunc: uint64(checkFunc),
		UnixSeconds: uint64(unixSeconds),
	}, devices)
	copy(unsafe.Slice((*byte)(unsafe.Pointer(out)), 16), answer[:])
	return 0
}

// Device attributes (CUdevice_attribute) the integrity hash covers.
const (
	attrPCIBus    = 33
	attrPCIDevice = 34
	attrPCIDomain = 50
)

// deviceIdentities is every device's part of the integrity hash, as the
// runtime sees the devices through this driver.
func deviceIdentities() ([]cuapi.DeviceIdentity, cuapi.Result) {
	n, r := drv.DeviceGetCount()
	if r != cuapi.Success {
		return nil, r
	}
	ids := make([]cuapi.DeviceIdentity, n)
	for dev := range ids {
		id := &ids[dev]
		if id.UUID, r = drv.DeviceUUID(int32(dev)); r != cuapi.Success {
			return nil, r
		}
		for _, a := range []struct {
			attr int32
			v    *int32
		}{{attrPCIDomain, &id.PCIDomain}, {attrPCIBus, &id.Bus}, {attrPCIDevice, &id.Slot}} {
			if *a.v, r = drv.DeviceAttribute(a.attr, int32(dev)); r != cuapi.Success {
				return nil, r
			}
		}
	}
	return ids, cuapi.Success
}

//export vgCtxGetLimit
func vgCtxGetLimit(v *C.size_t, limit C.int) C.CUresult {
	if v == nil {
		return errInvalid
	}
	x, r := drv.CtxGetLimit(thread{}, int32(limit))
	if r == cuapi.Success {
		*v = C.size_t(x)
	}
	return res(r)
}

//export vgCtxSetLimit
func vgCtxSetLimit(limit C.int, v C.size_t) C.CUresult {
	return res(drv.CtxSetLimit(thread{}, int32(limit), uint64(v)))
}

//export vgCtxGetFlags
func vgCtxGetFlags(flags *C.uint) C.CUresult {
	if flags == nil {
		return errInvalid
	}
	f, r := drv.CtxGetFlags(thread{})
	if r == cuapi.Success {
		*flags = C.uint(f)
	}
	return res(r)
}

//export vgCtxSetFlags
func vgCtxSetFlags(flags C.uint) C.CUresult { return res(drv.CtxSetFlags(thread{}, uint32(flags))) }

//export vgCtxLive
func vgCtxLive(ctx C.uintptr_t, out *C.uintptr_t) C.CUresult {
	c, r := drv.CtxLive(thread{}, uint64(ctx))
	return outHandle(out, c, r)
}

//export vgPrimaryCtxGetState
func vgPrimaryCtxGetState(dev C.CUdevice, flags *C.uint, active *C.int) C.CUresult {
	if flags == nil || active == nil {
		return errInvalid
	}
	f, on, r := drv.PrimaryCtxGetState(int32(dev))
	if r == cuapi.Success {
		*flags, *active = C.uint(f), 0
		if on {
			*active = 1
		}
	}
	return res(r)
}

//export vgPrimaryCtxSetFlags
func vgPrimaryCtxSetFlags(dev C.CUdevice, flags C.uint) C.CUresult {
	return res(drv.PrimaryCtxSetFlags(int32(dev), uint32(flags)))
}

//export vgStreamInfo
func vgStreamInfo(s C.uintptr_t, flags *C.uint, ctx *C.uintptr_t) C.CUresult {
	f, c, r := drv.StreamInfo(thread{}, uint64(s))
	if r == cuapi.Success {
		if flags != nil {
			*flags = C.uint(f)
		}
		if ctx != nil {
			*ctx = C.uintptr_t(c)
		}
	}
	return res(r)
}

//export vgLibraryLoadData
func vgLibraryLoadData(lib *C.uintptr_t, image unsafe.Pointer) C.CUresult {
	return loadFrom(lib, image, drv.LibraryLoadData)
}

//export vgPointerInfo
func vgPointerInfo(p C.CUdeviceptr, kind *C.uint, ctx *C.uintptr_t, base *C.CUdeviceptr, size *C.size_t, readOnly *C.uint) C.CUresult {
	info, r := drv.Pointer(uint64(p))
	if r != cuapi.Success {
		return res(r)
	}
	*kind, *ctx, *base, *size = C.uint(info.Kind), C.uintptr_t(info.Ctx), C.CUdeviceptr(info.Base), C.size_t(info.Size)
	*readOnly = 0
	if info.ReadOnly {
		*readOnly = 1
	}
	return 0
}

// funcNames keeps the C strings cuFuncGetName hands out: CUDA's stay valid
// while the function's module is loaded; these for the process's life.
var funcNames sync.Map // function handle -> *C.char

// vgFuncGetName checks f on every call, also when its name is kept: the C
// half uses it as its check of a function handle, and a function of an
// unloaded module is no longer one.
//
//export vgFuncGetName
func vgFuncGetName(name **C.char, f C.uintptr_t) C.CUresult {
	if name == nil {
		return errInvalid
	}
	n, r := drv.FuncName(uint64(f))
	if r != cuapi.Success {
		return res(r)
	}
	s, ok := funcNames.Load(uint64(f))
	if !ok {
		s, _ = funcNames.LoadOrStore(uint64(f), C.CString(n))
	}
	*name = s.(*C.char)
	return 0
}

//export vgFuncGetParamInfo
func vgFuncGetParamInfo(f C.uintptr_t, index C.size_t, offset, size *C.size_t) C.CUresult {
	offs, sizes, r := drv.ParamInfo(uint64(f))
	if r != cuapi.Success {
		return res(r)
	}
	if uint64(index) >= uint64(len(offs)) {
		return errInvalid
	}
	if offset != nil {
		*offset = C.size_t(offs[index])
	}
	if size != nil {
		*size = C.size_t(sizes[index])
	}
	return 0
}

//export vgPrimaryCtxHandle
func vgPrimaryCtxHandle() C.uintptr_t { return C.uintptr_t(drv.PrimaryCtxHandle()) }

//export vgOccupancyAvailableDynamicSMem
func vgOccupancyAvailableDynamicSMem(n *C.size_t, f C.uintptr_t, numBlocks, blockSize C.int) C.CUresult {
	if n == nil {
		return errInvalid
	}
	v, r := drv.OccupancyAvailableDynamicSMem(uint64(f), int32(numBlocks), int32(blockSize))
	if r == cuapi.Success {
		*n = C.size_t(v)
	}
	return res(r)
}
