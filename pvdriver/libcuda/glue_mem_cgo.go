package main

/*
#include <stdlib.h>
#include <string.h>
#include "vgcuda.h"

// vg_b2d calls the program's occupancy callback.
static inline size_t vg_b2d(CUoccupancyB2DSize fn, int blockSize) { return fn(blockSize); }
// vg_extra2 finds CU_LAUNCH_PARAM_BUFFER_POINTER and _SIZE (keys 1 and 2)
// in cuLaunchKernel's extra list, ended by CU_LAUNCH_PARAM_END (0); -1 for
// a malformed list.
static inline int vg_extra2(void **extra, void **buf, size_t *size) {
	int i, have = 0;
	for (i = 0; i < 64 && extra[i] != (void *)0; i += 2) {
		if (extra[i] == (void *)1) { *buf = extra[i + 1]; have |= 1; }
		else if (extra[i] == (void *)2 && extra[i + 1] != NULL) { *size = *(size_t *)extra[i + 1]; have |= 2; }
		else return -1;
	}
	return i < 64 && have == 3 ? 0 : -1;
}
*/
import "C"

import (
	"encoding/binary"
	"fmt"
	"os"
	"unsafe"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/pvdriver/cuapi"
)

//export vgMemAlloc
func vgMemAlloc(p *C.CUdeviceptr, n C.size_t) C.CUresult {
	if p == nil {
		return errInvalid
	}
	v, r := drv.MemAlloc(thread{}, uint64(n))
	if r == cuapi.Success {
		*p = C.CUdeviceptr(v)
	}
	return res(r)
}

//export vgMemAllocPitch
func vgMemAllocPitch(p *C.CUdeviceptr, pitch *C.size_t, w, h C.size_t, elem C.uint) C.CUresult {
	if p == nil || pitch == nil {
		return errInvalid
	}
	v, pi, r := drv.MemAllocPitch(thread{}, uint64(w), uint64(h), uint32(elem))
	if r == cuapi.Success {
		*p, *pitch = C.CUdeviceptr(v), C.size_t(pi)
	}
	return res(r)
}

//export vgMemFree
func vgMemFree(p C.CUdeviceptr) C.CUresult { return res(drv.MemFree(thread{}, uint64(p))) }

//export vgMemGetInfo
func vgMemGetInfo(free, total *C.size_t) C.CUresult {
	if free == nil || total == nil {
		return errInvalid
	}
	f, t, r := drv.MemGetInfo(thread{})
	if r == cuapi.Success {
		*free, *total = C.size_t(f), C.size_t(t)
	}
	return res(r)
}

//export vgMemcpyHtoD
func vgMemcpyHtoD(dst C.CUdeviceptr, src unsafe.Pointer, n C.size_t, s C.uintptr_t, async C.int) C.CUresult {
	b, ok := hostBytes(src, n)
	if !ok {
		return errInvalid
	}
	return res(drv.MemcpyHtoD(thread{}, uint64(dst), b, uint64(s), async != 0))
}

//export vgMemcpyDtoH
func vgMemcpyDtoH(dst unsafe.Pointer, src C.CUdeviceptr, n C.size_t, s C.uintptr_t) C.CUresult {
	b, ok := hostBytes(dst, n)
	if !ok {
		return errInvalid
	}
	return res(drv.MemcpyDtoH(thread{}, b, uint64(src), uint64(s)))
}

//export vgMemcpyDtoD
func vgMemcpyDtoD(dst, src C.CUdeviceptr, n C.size_t, s C.uintptr_t, async C.int) C.CUresult {
	return res(drv.MemcpyDtoD(thread{}, uint64(dst), uint64(src), uint64(n), uint64(s), async != 0))
}

// vgMemcpy is cuMemcpy and cuMemcpyAsync: with unified addressing the
// addresses say where each side lives (the session's window is device
// memory, anything else host memory). The C half passes each address both
// as an integer and as a pointer.
//
//export vgMemcpy
func vgMemcpy(dst, src C.CUdeviceptr, dstp, srcp unsafe.Pointer, n C.size_t, s C.uintptr_t, async C.int) C.CUresult {
	t, nn := thread{}, uint64(n)
	dDev := drv.IsDevice(uint64(dst), nn) || drv.IsGlobal(uint64(dst), nn)
	sDev := drv.IsDevice(uint64(src), nn) || drv.IsGlobal(uint64(src), nn)
	switch {
	case dDev && sDev:
		return res(drv.MemcpyDtoD(t, uint64(dst), uint64(src), nn, uint64(s), async != 0))
	case dDev:
		return vgMemcpyHtoD(dst, srcp, n, s, async)
	case sDev:
		return vgMemcpyDtoH(dstp, src, n, s)
	}
	d, ok1 := hostBytes(dstp, n)
	h, ok2 := hostBytes(srcp, n)
	if !ok1 || !ok2 {
		return errInvalid
	}
	copy(d, h)
	return 0
}

//export vgMemset
func vgMemset(dst C.CUdeviceptr, width C.int, v C.uint, count C.size_t, s C.uintptr_t, async C.int) C.CUresult {
	return res(drv.Memset(thread{}, uint64(dst), uint8(width), uint32(v), uint64(count), uint64(s), async != 0))
}

//export vgMemAllocHost
func vgMemAllocHost(pp *unsafe.Pointer, n C.size_t) C.CUresult {
	if pp == nil {
		return errInvalid
	}
	if r := drv.HostAllocCheck(thread{}, uint64(n)); r != cuapi.Success {
		return res(r)
	}
	// The session's host-memory region first (page-locked on the node),
	// ordinary memory when it has no room.
	if b := drv.HostAllocRegion(uint64(n)); b != nil {
		p := unsafe.Pointer(unsafe.SliceData(b))
		drv.NoteHost(thread{}, uintptr(p), uint64(n), b)
		*pp = p
		return 0
	}
	var p unsafe.Pointer
	if C.posix_memalign(&p, 4096, n) != 0 {
		return res(cuapi.ErrorOutOfMemory)
	}
	drv.NoteHost(thread{}, uintptr(p), uint64(n), nil)
	*pp = p
	return 0
}

//export vgMemFreeHost
func vgMemFreeHost(p unsafe.Pointer) C.CUresult {
	r, cFree := drv.HostFree(uintptr(p))
	if cFree {
		C.free(p)
	}
	return res(r)
}

//export vgModuleLoad
func vgModuleLoad(m *C.uintptr_t, fname *C.char) C.CUresult {
	if m == nil || fname == nil {
		return errInvalid
	}
	h, r := drv.ModuleLoadFile(thread{}, C.GoString(fname))
	return outHandle(m, h, r)
}

// vgModuleLoadData reads an image of unknown length: a fatbin or an ELF
// cubin says its length in its headers, PTX ends at its NUL. A fatbin
// wrapper (what nvcc embeds and cuModuleLoadFatBinary may be given) points
// at its fatbin.
//
//export vgModuleLoadData
func vgModuleLoadData(m *C.uintptr_t, image unsafe.Pointer) C.CUresult {
	return loadFrom(m, image, drv.ModuleLoadData)
}

// loadFrom reads the image at image and hands it to load (a module's or a
// library's), storing the handle in *out.
func loadFrom(out *C.uintptr_t, image unsafe.Pointer, load func(cuapi.Thread, []byte) (uint64, cuapi.Result)) C.CUresult {
	if out == nil || image == nil {
		return errInvalid
	}
	img, r := readImage(image)
	if r != cuapi.Success {
		return res(r)
	}
	h, r := load(thread{}, img)
	return outHandle(out, h, r)
}

// readImage copies the image at p: its headers say how long a fatbin or
// cubin is (a cubin's section table says where its last section ends),
// PTX is a NUL-terminated string. A fatbin wrapper (what the CUDA runtime
// hands cuModuleLoadData and cuLibraryLoadData) stands for the fatbin it
// points at.
func readImage(p unsafe.Pointer) ([]byte, cuapi.Result) {
	if C.strnlen((*C.char)(p), 4) == 4 && binary.LittleEndian.Uint32(C.GoBytes(p, 4)) == cuapi.FatbinWrapperMagic {
		p = *(*unsafe.Pointer)(unsafe.Add(p, 8)) // __fatBinC_Wrapper_t.data
		if p == nil {
			return nil, cuapi.ErrorInvalidImage
		}
	}
	if C.strnlen((*C.char)(p), 4) == 4 && cuapi.IsBinaryImage(C.GoBytes(p, 4)) {
		n, _, ok := cuapi.ImageSize(C.GoBytes(p, 64))
		if ok && n > maxImage {
			cuapi.RefuseImageSize(n)
		}
		if !ok || n < 64 || n > maxImage {
			return nil, cuapi.ErrorInvalidImage
		}
		img := C.GoBytes(p, C.int(n))
		if end, ok := cuapi.CubinEnd(img); ok && end > n && end <= maxImage {
			img = C.GoBytes(p, C.int(end))
		}
		return img, cuapi.Success
	}
	n := C.strnlen((*C.char)(p), maxImage+1)
	if n > maxImage {
		fmt.Fprintf(os.Stderr, "vgpuha libcuda: a PTX image longer than %d bytes is refused: the library loads images of at most that (CUDA_ERROR_INVALID_IMAGE)\n", maxImage)
		return nil, cuapi.ErrorInvalidImage
	}
	return C.GoBytes(p, C.int(n)), cuapi.Success
}

//export vgModuleUnload
func vgModuleUnload(m C.uintptr_t) C.CUresult { return res(drv.ModuleUnload(thread{}, uint64(m))) }

//export vgModuleGetFunction
func vgModuleGetFunction(f *C.uintptr_t, m C.uintptr_t, name *C.char) C.CUresult {
	if f == nil || name == nil {
		return errInvalid
	}
	h, r := drv.ModuleGetFunction(uint64(m), C.GoString(name))
	return outHandle(f, h, r)
}

//export vgModuleGetGlobal
func vgModuleGetGlobal(p *C.CUdeviceptr, n *C.size_t, m C.uintptr_t, name *C.char) C.CUresult {
	if name == nil {
		return errInvalid
	}
	v, size, r := drv.ModuleGetGlobal(uint64(m), C.GoString(name))
	if r == cuapi.Success {
		if p != nil {
			*p = C.CUdeviceptr(v)
		}
		if n != nil {
			*n = C.size_t(size)
		}
	}
	return res(r)
}

//export vgLaunchKernel
func vgLaunchKernel(f C.uintptr_t, gx, gy, gz, bx, by, bz, shared C.uint, s C.uintptr_t, kp, extra *unsafe.Pointer, cx, cy, cz, coop C.uint) C.CUresult {
	params, packed, r := launchParams(uint64(f), kp, extra)
	if r != 0 {
		return r
	}
	l := cuapi.Launch{Grid: [3]uint32{uint32(gx), uint32(gy), uint32(gz)}, Block: [3]uint32{uint32(bx), uint32(by), uint32(bz)},
		SharedBytes: uint32(shared), Stream: uint64(s), Cluster: [3]uint32{uint32(cx), uint32(cy), uint32(cz)}, Cooperative: coop != 0}
	return res(drv.LaunchKernel(thread{}, uint64(f), l, params, packed))
}

// launchParams copies a launch's arguments of function f: each parameter's
// bytes behind kernelParams (kp), or the buffer CU_LAUNCH_PARAM_BUFFER_POINTER
// names in extra. Neither is a launch of no parameters.
func launchParams(f uint64, kp, extra *unsafe.Pointer) (params [][]byte, packed []byte, r C.CUresult) {
	sizes, rr := drv.ParamLayout(f)
	if rr != cuapi.Success {
		return nil, nil, res(rr)
	}
	switch {
	case kp != nil && extra != nil:
		return nil, nil, errInvalid
	case kp != nil:
		ptrs := unsafe.Slice(kp, len(sizes))
		params = make([][]byte, len(sizes))
		total := 0
		for _, n := range sizes {
			total += n
		}
		all := make([]byte, 0, total) // one allocation for every parameter's copy
		for i, n := range sizes {
			b, ok := hostBytes(ptrs[i], C.size_t(n))
			if !ok {
				return nil, nil, errInvalid
			}
			all = append(all, b...)
			params[i] = all[len(all)-len(b) : len(all) : len(all)]
		}
	case extra != nil:
		var buf unsafe.Pointer
		var n C.size_t
		if C.vg_extra2(extra, &buf, &n) != 0 || n > 4096 {
			return nil, nil, errInvalid
		}
		b, ok := hostBytes(buf, n)
		if !ok {
			return nil, nil, errInvalid
		}
		packed = append([]byte{}, b...)
	}
	return params, packed, 0
}

//export vgFuncGetAttribute
func vgFuncGetAttribute(v *C.int, attr C.int, f C.uintptr_t) C.CUresult {
	x, r := drv.FuncGetAttribute(int32(attr), uint64(f))
	return outInt(v, x, r)
}

//export vgFuncSetAttribute
func vgFuncSetAttribute(f C.uintptr_t, attr, v C.int) C.CUresult {
	return res(drv.FuncSetAttribute(uint64(f), int32(attr), int32(v)))
}

//export vgOccupancyMaxActiveBlocks
func vgOccupancyMaxActiveBlocks(n *C.int, f C.uintptr_t, bs C.int, smem C.size_t, flags C.uint) C.CUresult {
	v, r := drv.OccupancyMaxActiveBlocks(uint64(f), int32(bs), uint64(smem), uint32(flags))
	return outInt(n, v, r)
}

//export vgOccupancyClusters
func vgOccupancyClusters(n *C.int, f C.uintptr_t, kind C.int, gx, gy, gz, bx, by, bz, smem, cx, cy, cz C.uint) C.CUresult {
	q := abi.Occupancy{Kind: abi.OccupancyKind(kind), Grid: abi.Dim3{X: uint32(gx), Y: uint32(gy), Z: uint32(gz)},
		Block: abi.Dim3{X: uint32(bx), Y: uint32(by), Z: uint32(bz)}, SharedBytes: uint32(smem),
		Cluster: abi.Dim3{X: uint32(cx), Y: uint32(cy), Z: uint32(cz)}}
	v, r := drv.OccupancyClusters(uint64(f), q)
	return outInt(n, v, r)
}

//export vgOccupancyMaxPotentialBlockSize
func vgOccupancyMaxPotentialBlockSize(minGrid, block *C.int, f C.uintptr_t, cb C.CUoccupancyB2DSize, smem C.size_t, limit C.int) C.CUresult {
	if minGrid == nil || block == nil {
		return errInvalid
	}
	var smemFor func(int32) uint64
	if cb != nil {
		smemFor = func(bs int32) uint64 { return uint64(C.vg_b2d(cb, C.int(bs))) }
	}
	g, b, r := drv.OccupancyMaxPotentialBlockSize(uint64(f), smemFor, uint64(smem), int32(limit))
	if r == cuapi.Success {
		*minGrid, *block = C.int(g), C.int(b)
	}
	return res(r)
}

//export vgStreamCreate
func vgStreamCreate(s *C.uintptr_t, flags C.uint) C.CUresult {
	if s == nil {
		return errInvalid
	}
	h, r := drv.StreamCreate(thread{}, uint32(flags))
	return outHandle(s, h, r)
}

//export vgStreamDestroy
func vgStreamDestroy(s C.uintptr_t) C.CUresult { return res(drv.StreamDestroy(thread{}, uint64(s))) }

//export vgStreamSynchronize
func vgStreamSynchronize(s C.uintptr_t) C.CUresult {
	return res(drv.StreamSynchronize(thread{}, uint64(s)))
}

//export vgStreamWaitEvent
func vgStreamWaitEvent(s, e C.uintptr_t, flags C.uint) C.CUresult {
	return res(drv.StreamWaitEvent(thread{}, uint64(s), uint64(e), uint32(flags)))
}

//export vgEventCreate
func vgEventCreate(e *C.uintptr_t, flags C.uint) C.CUresult {
	if e == nil {
		return errInvalid
	}
	h, r := drv.EventCreate(thread{}, uint32(flags))
	return outHandle(e, h, r)
}

//export vgEventRecord
func vgEventRecord(e, s C.uintptr_t) C.CUresult {
	return res(drv.EventRecord(thread{}, uint64(e), uint64(s)))
}

//export vgEventQuery
func vgEventQuery(e C.uintptr_t) C.CUresult { return res(drv.EventQuery(uint64(e))) }

//export vgEventElapsedTime
func vgEventElapsedTime(ms *C.float, a, b C.uintptr_t) C.CUresult {
	if ms == nil {
		return errInvalid
	}
	v, r := drv.EventElapsedTime(uint64(a), uint64(b))
	if r == cuapi.Success {
		*ms = C.float(v)
	}
	return res(r)
}

//export vgEventDestroy
func vgEventDestroy(e C.uintptr_t) C.CUresult { return res(drv.EventDestroy(uint64(e))) }

//export vgMemMapAperture
func vgMemMapAperture(dptr *C.CUdeviceptr, host *unsafe.Pointer, n C.size_t, kind C.uint) C.CUresult {
	if dptr == nil || host == nil {
		return errInvalid
	}
	p, mem, r := drv.MapAperture(thread{}, uint64(n), uint32(kind))
	if r == cuapi.Success {
		*dptr, *host = C.CUdeviceptr(p), unsafe.Pointer(unsafe.SliceData(mem))
	}
	return res(r)
}

//export vgMemUnmapAperture
func vgMemUnmapAperture(dptr C.CUdeviceptr) C.CUresult {
	return res(drv.UnmapAperture(thread{}, uint64(dptr)))
}
