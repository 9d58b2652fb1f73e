package main

/*
#include "vgcuda.h"
*/
import "C"

import (
	"unsafe"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// The Go entry of tensor maps (pvdriver/cuapi/tensormap.go; the C entry is
// in exports_tensormap.c).

//export vgTensorMapEncodeTiled
func vgTensorMapEncodeTiled(m unsafe.Pointer, dataType C.int, rank C.cuuint32_t, global unsafe.Pointer,
	dims, strides *C.cuuint64_t, box, elementStrides *C.cuuint32_t, interleave, swizzle, l2Promotion, oobFill C.int) C.CUresult {
	n := int(rank)
	if m == nil || dims == nil || box == nil || elementStrides == nil || (n > 1 && strides == nil) || n < 1 || n > abi.MaxTensorRank {
		return errInvalid
	}
	r := abi.TensorMapEncode{DataType: uint32(dataType), Rank: uint32(rank), Global: uint64(uintptr(global)),
		Interleave: uint32(interleave), Swizzle: uint32(swizzle), L2Promotion: uint32(l2Promotion), OOBFill: uint32(oobFill)}
	for i, v := range unsafe.Slice(dims, n) {
		r.Dims[i] = uint64(v)
	}
	if n > 1 {
		for i, v := range unsafe.Slice(strides, n-1) {
			r.Strides[i] = uint64(v)
		}
	}
	for i, v := range unsafe.Slice(box, n) {
		r.Box[i] = uint32(v)
	}
	for i, v := range unsafe.Slice(elementStrides, n) {
		r.ElementStrides[i] = uint32(v)
	}
	mp, result := drv.TensorMapEncodeTiled(thread{}, &r)
	if result == 0 {
		copy(unsafe.Slice((*byte)(m), abi.TensorMapBytes), mp[:])
	}
	return res(result)
}
