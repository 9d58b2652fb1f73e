package cuda

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// The CUDA driver API, loaded from libcuda at run time with purego so the
// binary builds (CGO_ENABLED=0) and runs everywhere, and fails with a clear
// error only when --backend cuda is asked for where there is no driver.
// Signatures follow the CUDA Driver API reference (cuda.h, CUDA 12/13);
// the _v2 entry points are the ones cuda.h maps the plain names to.

type result int32

type driver struct {
	cuInit                        func(flags uint32) result
	cuDriverGetVersion            func(v *int32) result
	cuDeviceGet                   func(dev *int32, ordinal int32) result
	cuDeviceGetName               func(name *byte, n int32, dev int32) result
	cuCtxCreate                   func(ctx *uintptr, flags uint32, dev int32) result
	cuCtxDestroy                  func(ctx uintptr) result
	cuCtxSetCurrent               func(ctx uintptr) result
	cuCtxSynchronize              func() result
	cuMemGetAllocationGranularity func(g *uint64, prop *memAllocationProp, option int32) result
	cuMemAddressReserve           func(ptr *uint64, size, align, addr uint64, flags uint64) result
	cuMemAddressFree              func(ptr, size uint64) result
	cuMemCreate                   func(h *uint64, size uint64, prop *memAllocationProp, flags uint64) result
	cuMemRelease                  func(h uint64) result
	cuMemMap                      func(ptr, size, offset uint64, h uint64, flags uint64) result
	cuMemUnmap                    func(ptr, size uint64) result
	cuMemSetAccess                func(ptr, size uint64, desc *memAccessDesc, count uint64) result
	cuMemcpyHtoD                  func(dst uint64, src unsafe.Pointer, n uint64) result
	cuMemcpyDtoH                  func(dst unsafe.Pointer, src uint64, n uint64) result
	cuMemcpyDtoD                  func(dst, src, n uint64) result
	cuMemcpyHtoDAsync             func(dst uint64, src unsafe.Pointer, n uint64, s uintptr) result
	cuMemcpyDtoDAsync             func(dst, src, n uint64, s uintptr) result
	cuMemsetD8Async               func(dst uint64, v uint8, n uint64, s uintptr) result
	cuMemsetD32Async              func(dst uint64, v uint32, n uint64, s uintptr) result
	cuModuleLoadData              func(m *uintptr, image *byte) result
	cuModuleUnload                func(m uintptr) result
	cuModuleGetFunction           func(f *uintptr, m uintptr, name *byte) result
	cuLaunchKernel                func(f uintptr, gx, gy, gz, bx, by, bz, shared uint32, s uintptr, params unsafe.Pointer, extra unsafe.Pointer) result
	cuStreamCreate                func(s *uintptr, flags uint32) result
	cuStreamDestroy               func(s uintptr) result
	cuStreamSynchronize           func(s uintptr) result
	cuMemAlloc                    func(p *uint64, n uint64) result
	cuMemFree                     func(p uint64) result
	cuMemAllocHost                func(p *unsafe.Pointer, n uint64) result
	cuMemHostAlloc                func(p *unsafe.Pointer, n uint64, flags uint32) result
	cuMemFreeHost                 func(p unsafe.Pointer) result
	cuGetErrorName                func(r result, s **byte) result
	cuGetErrorString              func(r result, s **byte) result
}

// CUmemAllocationProp (cuda.h): 32 bytes.
type memAllocationProp struct {
	typ                  int32 // CU_MEM_ALLOCATION_TYPE_PINNED = 1
	requestedHandleTypes int32
	locationType         int32 // CU_MEM_LOCATION_TYPE_DEVICE = 1
	locationID           int32
	win32HandleMetaData  uintptr
	allocFlags           [8]byte
}

// CUmemAccessDesc (cuda.h): 12 bytes.
type memAccessDesc struct {
	locationType int32
	locationID   int32
	flags        int32 // CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
}

var (
	loadOnce sync.Once
	drv      *driver
	loadErr  error
)

// ErrNoDriver reports that the CUDA driver library cannot be loaded.
var ErrNoDriver = errors.New("cuda: the NVIDIA driver library (libcuda.so.1) is not available on this machine; use --backend sim, or install the NVIDIA driver")

func load() (*driver, error) {
	loadOnce.Do(func() {
		var lib uintptr
		var err error
		for _, name := range []string{"libcuda.so.1", "libcuda.so"} {
			if lib, err = purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_GLOBAL); err == nil {
				break
			}
		}
		if err != nil {
			loadErr = fmt.Errorf("%w (%v)", ErrNoDriver, err)
			return
		}
		d := &driver{}
		syms := []struct {
			fn   any
			name string
		}{
			{&d.cuInit, "cuInit"}, {&d.cuDriverGetVersion, "cuDriverGetVersion"},
			{&d.cuDeviceGet, "cuDeviceGet"}, {&d.cuDeviceGetName, "cuDeviceGetName"},
			{&d.cuCtxCreate, "cuCtxCreate_v2"}, {&d.cuCtxDestroy, "cuCtxDestroy_v2"},
			{&d.cuCtxSetCurrent, "cuCtxSetCurrent"}, {&d.cuCtxSynchronize, "cuCtxSynchronize"},
			{&d.cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity"},
			{&d.cuMemAddressReserve, "cuMemAddressReserve"}, {&d.cuMemAddressFree, "cuMemAddressFree"},
			{&d.cuMemCreate, "cuMemCreate"}, {&d.cuMemRelease, "cuMemRelease"},
			{&d.cuMemMap, "cuMemMap"}, {&d.cuMemUnmap, "cuMemUnmap"}, {&d.cuMemSetAccess, "cuMemSetAccess"},
			{&d.cuMemcpyHtoD, "cuMemcpyHtoD_v2"}, {&d.cuMemcpyDtoH, "cuMemcpyDtoH_v2"},
			{&d.cuMemcpyDtoD, "cuMemcpyDtoD_v2"}, {&d.cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"},
			{&d.cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"},
			{&d.cuMemsetD8Async, "cuMemsetD8Async"}, {&d.cuMemsetD32Async, "cuMemsetD32Async"},
			{&d.cuModuleLoadData, "cuModuleLoadData"}, {&d.cuModuleUnload, "cuModuleUnload"},
			{&d.cuModuleGetFunction, "cuModuleGetFunction"}, {&d.cuLaunchKernel, "cuLaunchKernel"},
			{&d.cuStreamCreate, "cuStreamCreate"}, {&d.cuStreamDestroy, "cuStreamDestroy_v2"},
			{&d.cuStreamSynchronize, "cuStreamSynchronize"},
			{&d.cuMemAlloc, "cuMemAlloc_v2"}, {&d.cuMemFree, "cuMemFree_v2"},
			{&d.cuMemAllocHost, "cuMemAllocHost_v2"}, {&d.cuMemHostAlloc, "cuMemHostAlloc"}, {&d.cuMemFreeHost, "cuMemFreeHost"},
			{&d.cuGetErrorName, "cuGetErrorName"}, {&d.cuGetErrorString, "cuGetErrorString"},
		}
		for _, s := range syms {
			if _, err := purego.Dlsym(lib, s.name); err != nil {
				loadErr = fmt.Errorf("cuda: libcuda lacks %s: %v", s.name, err)
				return
			}
			purego.RegisterLibFunc(s.fn, lib, s.name)
		}
		drv = d
	})
	return drv, loadErr
}

func cstring(p *byte) string {
	if p == nil {
		return ""
	}
	var b []byte
	for q := unsafe.Pointer(p); *(*byte)(q) != 0; q = unsafe.Add(q, 1) {
		b = append(b, *(*byte)(q))
	}
	return string(b)
}

// Error is a failed driver call.
type Error struct {
	Call   string
	Code   int32
	Name   string
	Detail string
	Status abi.Status
}

func (e *Error) Error() string {
	return fmt.Sprintf("cuda: %s: %s (%d): %s", e.Call, e.Name, e.Code, e.Detail)
}

// Unwrap gives the guest-facing status, so errors.Is(err, abi.StatusX) works.
func (e *Error) Unwrap() error { return e.Status }

// check turns a CUresult into an error. Codes from cuda.h's cudaError_enum.
func (d *driver) check(call string, r result) error {
	if r == 0 {
		return nil
	}
	var name, detail *byte
	d.cuGetErrorName(r, &name)
	d.cuGetErrorString(r, &detail)
	st := abi.StatusInternal
	switch r {
	case 1: // CUDA_ERROR_INVALID_VALUE
		st = abi.StatusInvalidValue
	case 2: // CUDA_ERROR_OUT_OF_MEMORY
		st = abi.StatusOutOfMemory
	case 200, 218, 209, 300, 301, 500: // invalid image / PTX, no binary, invalid source, file not found, not found
		st = abi.StatusNotSupported
	case 700, 701, 702, 714, 715, 716, 719: // illegal address, launch out of resources, timeout, ..., launch failed
		st = abi.StatusLaunchFailed
	case 400: // CUDA_ERROR_INVALID_HANDLE
		st = abi.StatusInvalidHandle
	}
	return &Error{Call: call, Code: int32(r), Name: cstring(name), Detail: cstring(detail), Status: st}
}
