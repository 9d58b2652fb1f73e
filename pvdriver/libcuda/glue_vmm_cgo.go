package main

/*
#include "vgcuda.h"
*/
import "C"

import (
	"unsafe"

	"github.com/vgpuha/vgpuha/pvdriver/cuapi"
)

// The Go entries of virtual memory management (pvdriver/cuapi/vmm.go; the
// C entries are in exports_vmm.c): they read CUDA's structures into
// cuapi's and write the answers back.

// allocProp reads a CUmemAllocationProp.
func allocProp(p *C.CUmemAllocationProp) cuapi.AllocProp {
	return cuapi.AllocProp{Type: int32(p._type), HandleTypes: int32(p.requestedHandleTypes),
		LocationType: int32(p.location._type), LocationID: int32(p.location.id),
		Compression: uint8(p.allocFlags.compressionType), Usage: uint16(p.allocFlags.usage)}
}

//export vgMemGetAllocationGranularity
func vgMemGetAllocationGranularity(g *C.size_t, p *C.CUmemAllocationProp, option C.int) C.CUresult {
	if g == nil || p == nil {
		return errInvalid
	}
	v, r := drv.MemGetAllocationGranularity(allocProp(p), uint32(option))
	if r == cuapi.Success {
		*g = C.size_t(v)
	}
	return res(r)
}

//export vgMemAddressReserve
func vgMemAddressReserve(p *C.CUdeviceptr, size, align C.size_t, hint C.CUdeviceptr, flags C.ulonglong) C.CUresult {
	if p == nil {
		return errInvalid
	}
	v, r := drv.MemAddressReserve(uint64(size), uint64(align), uint64(hint), uint64(flags))
	if r == cuapi.Success {
		*p = C.CUdeviceptr(v)
	}
	return res(r)
}

//export vgMemAddressFree
func vgMemAddressFree(p C.CUdeviceptr, size C.size_t) C.CUresult {
	return res(drv.MemAddressFree(uint64(p), uint64(size)))
}

//export vgMemCreate
func vgMemCreate(h *C.CUmemGenericAllocationHandle, size C.size_t, p *C.CUmemAllocationProp, flags C.ulonglong) C.CUresult {
	if h == nil || p == nil {
		return errInvalid
	}
	v, r := drv.MemCreate(uint64(size), allocProp(p), uint64(flags))
	if r == cuapi.Success {
		*h = C.CUmemGenericAllocationHandle(v)
	}
	return res(r)
}

//export vgMemRelease
func vgMemRelease(h C.CUmemGenericAllocationHandle) C.CUresult { return res(drv.MemRelease(uint64(h))) }

//export vgMemMap
func vgMemMap(p C.CUdeviceptr, size, offset C.size_t, h C.CUmemGenericAllocationHandle, flags C.ulonglong) C.CUresult {
	return res(drv.MemMap(thread{}, uint64(p), uint64(size), uint64(offset), uint64(h), uint64(flags)))
}

//export vgMemUnmap
func vgMemUnmap(p C.CUdeviceptr, size C.size_t) C.CUresult {
	return res(drv.MemUnmap(uint64(p), uint64(size)))
}

//export vgMemSetAccess
func vgMemSetAccess(p C.CUdeviceptr, size C.size_t, desc *C.CUmemAccessDesc, count C.size_t) C.CUresult {
	if desc == nil || count == 0 || count > 64 {
		return errInvalid
	}
	descs := make([]cuapi.AccessDesc, count)
	for i, d := range unsafe.Slice(desc, int(count)) {
		descs[i] = cuapi.AccessDesc{LocationType: int32(d.location._type), LocationID: int32(d.location.id), Flags: int32(d.flags)}
	}
	return res(drv.MemSetAccess(uint64(p), uint64(size), descs))
}

//export vgMemGetAccess
func vgMemGetAccess(flags *C.ulonglong, loc *C.CUmemLocation, p C.CUdeviceptr) C.CUresult {
	if flags == nil || loc == nil {
		return errInvalid
	}
	v, r := drv.MemGetAccess(int32(loc._type), int32(loc.id), uint64(p))
	if r == cuapi.Success {
		*flags = C.ulonglong(v)
	}
	return res(r)
}

//export vgMemRetainAllocationHandle
func vgMemRetainAllocationHandle(h *C.CUmemGenericAllocationHandle, addr unsafe.Pointer) C.CUresult {
	if h == nil {
		return errInvalid
	}
	v, r := drv.MemRetainAllocationHandle(uint64(uintptr(addr)))
	if r == cuapi.Success {
		*h = C.CUmemGenericAllocationHandle(v)
	}
	return res(r)
}

//export vgMemGetAllocationPropertiesFromHandle
func vgMemGetAllocationPropertiesFromHandle(p *C.CUmemAllocationProp, h C.CUmemGenericAllocationHandle) C.CUresult {
	if p == nil {
		return errInvalid
	}
	v, r := drv.MemAllocationProp(uint64(h))
	if r == cuapi.Success {
		*p = C.CUmemAllocationProp{}
		p._type, p.requestedHandleTypes = C.int(v.Type), C.int(v.HandleTypes)
		p.location._type, p.location.id = C.int(v.LocationType), C.int(v.LocationID)
		p.allocFlags.compressionType, p.allocFlags.usage = C.uchar(v.Compression), C.ushort(v.Usage)
	}
	return res(r)
}
