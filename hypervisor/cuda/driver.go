package cuda

import (
	"errors"
	"fmt"
	"sync"

	"github.com/ebitengine/purego"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// The CUDA driver API, loaded from libcuda at run time with purego so the
// binary builds (CGO_ENABLED=0) and runs everywhere, and fails with a clear
// error only when --backend cuda is asked for where there is no driver.
// Signatures follow the CUDA Driver API reference (cuda.h, CUDA 12/13);
// the _v2 entry points are the ones cuda.h maps the plain names to. The
// function table itself, and the calls that pass Go memory by address,
// are in driver_unsafe.go.

// CUmemAllocationProp (cuda.h): 32 bytes.
type memAllocationProp struct {
	typ                  int32 // CU_MEM_ALLOCATION_TYPE_PINNED = 1
	requestedHandleTypes int32
	locationType         int32 // CU_MEM_LOCATION_TYPE_DEVICE = 1
	locationID           int32
	win32HandleMetaData  uintptr
	allocFlags           [8]byte
}

// resultNotSupported is CUDA_ERROR_NOT_SUPPORTED, answered here for an
// entry point this driver lacks.
const resultNotSupported result = 801

// Dynamic shared memory: what a function may use without raising its
// CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (8).
const (
	defaultDynamicShared     = 48 << 10
	funcAttrMaxDynamicShared = 8
	// attrMaxSharedOptIn is CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN.
	attrMaxSharedOptIn = 97
)

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
			{&d.cuDeviceGetCount, "cuDeviceGetCount"}, {&d.cuDeviceGet, "cuDeviceGet"}, {&d.cuDeviceGetName, "cuDeviceGetName"},
			{&d.cuDeviceGetAttribute, "cuDeviceGetAttribute"}, {&d.cuDeviceTotalMem, "cuDeviceTotalMem_v2"},
			{&d.cuDeviceGetUuid, "cuDeviceGetUuid"},
			{&d.cuCtxCreate, "cuCtxCreate_v2"}, {&d.cuCtxDestroy, "cuCtxDestroy_v2"},
			{&d.cuCtxSetCurrent, "cuCtxSetCurrent"}, {&d.cuCtxSynchronize, "cuCtxSynchronize"}, {&d.cuCtxGetLimit, "cuCtxGetLimit"},
			{&d.cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity"},
			{&d.cuMemAddressReserve, "cuMemAddressReserve"}, {&d.cuMemAddressFree, "cuMemAddressFree"},
			{&d.cuMemCreate, "cuMemCreate"}, {&d.cuMemRelease, "cuMemRelease"},
			{&d.cuMemMap, "cuMemMap"}, {&d.cuMemUnmap, "cuMemUnmap"}, {&d.cuMemSetAccess, "cuMemSetAccess"},
			{&d.cuMemcpyHtoD, "cuMemcpyHtoD_v2"}, {&d.cuMemcpyDtoH, "cuMemcpyDtoH_v2"},
			{&d.cuMemcpyDtoD, "cuMemcpyDtoD_v2"}, {&d.cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"},
			{&d.cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"}, {&d.cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"},
			{&d.cuMemsetD8Async, "cuMemsetD8Async"}, {&d.cuMemsetD32Async, "cuMemsetD32Async"},
			{&d.cuMemsetD16Async, "cuMemsetD16Async"},
			{&d.cuModuleLoadData, "cuModuleLoadData"}, {&d.cuModuleUnload, "cuModuleUnload"},
			{&d.cuModuleGetFunction, "cuModuleGetFunction"}, {&d.cuModuleGetGlobal, "cuModuleGetGlobal_v2"}, {&d.cuFuncGetAttribute, "cuFuncGetAttribute"}, {&d.cuFuncSetAttribute, "cuFuncSetAttribute"}, {&d.cuLaunchKernel, "cuLaunchKernel"},
			{&d.cuStreamCreate, "cuStreamCreate"}, {&d.cuStreamDestroy, "cuStreamDestroy_v2"},
			{&d.cuStreamSynchronize, "cuStreamSynchronize"},
			{&d.cuEventCreate, "cuEventCreate"}, {&d.cuEventRecord, "cuEventRecord"},
			{&d.cuEventSynchronize, "cuEventSynchronize"}, {&d.cuEventDestroy, "cuEventDestroy_v2"},
			{&d.cuMemAlloc, "cuMemAlloc_v2"}, {&d.cuMemFree, "cuMemFree_v2"},
			{&d.cuMemAllocHost, "cuMemAllocHost_v2"}, {&d.cuMemHostAlloc, "cuMemHostAlloc"}, {&d.cuMemFreeHost, "cuMemFreeHost"},
			{&d.cuMemHostRegister, "cuMemHostRegister_v2"}, {&d.cuMemHostUnregister, "cuMemHostUnregister"},
			{&d.cuGetErrorName, "cuGetErrorName"}, {&d.cuGetErrorString, "cuGetErrorString"},
		}
		for _, s := range syms {
			if _, err := purego.Dlsym(lib, s.name); err != nil {
				loadErr = fmt.Errorf("cuda: libcuda lacks %s: %v", s.name, err)
				return
			}
			purego.RegisterLibFunc(s.fn, lib, s.name)
		}
		if _, err := purego.Dlsym(lib, "cuFuncGetParamInfo"); err == nil {
			purego.RegisterLibFunc(&d.cuFuncGetParamInfo, lib, "cuFuncGetParamInfo")
		}
		if _, err := purego.Dlsym(lib, "cuLaunchKernelEx"); err == nil { // CUDA 12: cluster launches
			purego.RegisterLibFunc(&d.cuLaunchKernelEx, lib, "cuLaunchKernelEx")
		}
		for _, s := range []struct {
			fn   any
			name string
		}{
			{&d.cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags, "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags"},
			{&d.cuOccupancyMaxActiveClusters, "cuOccupancyMaxActiveClusters"}, // CUDA 11.8: clusters
			{&d.cuOccupancyMaxPotentialClusterSize, "cuOccupancyMaxPotentialClusterSize"},
		} {
			if _, err := purego.Dlsym(lib, s.name); err == nil {
				purego.RegisterLibFunc(s.fn, lib, s.name)
			}
		}
		if _, err := purego.Dlsym(lib, "cuTensorMapEncodeTiled"); err == nil { // CUDA 12: Hopper's tensor maps
			purego.RegisterLibFunc(&d.cuTensorMapEncodeTiled, lib, "cuTensorMapEncodeTiled")
		}
		drv = d
	})
	return drv, loadErr
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
	case 209: // CUDA_ERROR_NO_BINARY_FOR_GPU: callers try another image on it
		st = abi.StatusNoBinaryForGPU
	case 200, 218: // CUDA_ERROR_INVALID_IMAGE, CUDA_ERROR_INVALID_PTX
		st = abi.StatusInvalidImage
	case 500: // CUDA_ERROR_NOT_FOUND
		st = abi.StatusNotFound
	case 300, 301, 801: // invalid source, file not found, not supported
		st = abi.StatusNotSupported
	case 700, 701, 702, 714, 715, 716, 719: // illegal address, launch out of resources, timeout, ..., launch failed
		st = abi.StatusLaunchFailed
	case 400: // CUDA_ERROR_INVALID_HANDLE
		st = abi.StatusInvalidHandle
	case 720: // CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE: not sticky, the launch did not run
		st = abi.StatusCooperativeTooLarge
	}
	e := &Error{Call: call, Code: int32(r), Name: cstring(name), Detail: cstring(detail), Status: st}
	if r == 700 || r >= 714 && r <= 719 {
		d.lost.CompareAndSwap(nil, e)
	}
	return e
}

// Lost reports the fault that corrupted this process's CUDA state, if
// one did: after an illegal address, instruction or a failed launch (CUDA's
// "sticky" errors) every later call in the process fails, every context's
// included, until the process exits.
func (d *driver) Lost() error {
	if e := d.lost.Load(); e != nil {
		return e
	}
	return nil
}
