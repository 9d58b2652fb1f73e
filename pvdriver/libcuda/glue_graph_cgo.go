package main

/*
#include "vgcuda.h"
*/
import "C"

// The Go entries of stream capture and graphs (pvdriver/cuapi/graph.go;
// the C entries are in exports_graph.c).

//export vgStreamBeginCapture
func vgStreamBeginCapture(s C.uintptr_t, mode C.int) C.CUresult {
	if mode < 0 {
		return errInvalid
	}
	return res(drv.StreamBeginCapture(thread{}, uint64(s), uint32(mode)))
}

//export vgStreamEndCapture
func vgStreamEndCapture(s C.uintptr_t, g *C.uintptr_t) C.CUresult {
	if g == nil {
		return errInvalid
	}
	h, r := drv.StreamEndCapture(uint64(s))
	*g = C.uintptr_t(h) // NULL when the capture failed, as CUDA writes it
	return res(r)
}

//export vgStreamCaptureInfo
func vgStreamCaptureInfo(s C.uintptr_t, status *C.int, id *C.ulonglong, g *C.uintptr_t) C.CUresult {
	st, i, gr, r := drv.CaptureInfo(uint64(s))
	if status != nil {
		*status = C.int(st)
	}
	if id != nil {
		*id = C.ulonglong(i)
	}
	if g != nil {
		*g = C.uintptr_t(gr)
	}
	return res(r)
}

//export vgHostFuncPoint
func vgHostFuncPoint(s C.uintptr_t) C.CUresult { return res(drv.HostFuncPoint(thread{}, uint64(s))) }

//export vgGraphCreate
func vgGraphCreate(g *C.uintptr_t, flags C.uint) C.CUresult {
	h, r := drv.GraphCreate(thread{}, uint32(flags))
	return outHandle(g, h, r)
}

//export vgGraphNodeCount
func vgGraphNodeCount(g C.uintptr_t, n *C.size_t) C.CUresult {
	if n == nil {
		return errInvalid
	}
	c, r := drv.GraphNodeCount(uint64(g))
	if r == 0 {
		*n = C.size_t(c)
	}
	return res(r)
}

//export vgGraphDestroy
func vgGraphDestroy(g C.uintptr_t) C.CUresult { return res(drv.GraphDestroy(uint64(g))) }

//export vgGraphInstantiate
func vgGraphInstantiate(x *C.uintptr_t, g C.uintptr_t, flags C.ulonglong) C.CUresult {
	h, r := drv.GraphInstantiate(uint64(g), uint64(flags))
	return outHandle(x, h, r)
}

//export vgGraphLaunch
func vgGraphLaunch(x, s C.uintptr_t) C.CUresult {
	return res(drv.GraphLaunch(thread{}, uint64(x), uint64(s)))
}

//export vgGraphUpload
func vgGraphUpload(x, s C.uintptr_t) C.CUresult { return res(drv.GraphUpload(uint64(x), uint64(s))) }

//export vgGraphExecDestroy
func vgGraphExecDestroy(x C.uintptr_t) C.CUresult { return res(drv.GraphExecDestroy(uint64(x))) }
