package main

/*
#include "vgcuda.h"

// vg_ptr is a unified address as the pointer it also is.
static inline void *vg_ptr(CUdeviceptr d) { return (void *)(uintptr_t)d; }
*/
import "C"

import (
	"fmt"
	"math/bits"
	"os"
	"unsafe"

	"github.com/vgpuha/vgpuha/pvdriver/cuapi"
)

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

// vgGraphNodes is cuGraphGetNodes: the count alone (nodes nil), or up to
// *n handles with *n set to the count.
//
//export vgGraphNodes
func vgGraphNodes(g C.uintptr_t, nodes *C.uintptr_t, n *C.size_t) C.CUresult {
	if n == nil {
		return errInvalid
	}
	ids, r := drv.GraphNodes(uint64(g))
	if r == cuapi.Success {
		handOut(ids, nodes, n)
	}
	return res(r)
}

// handOut writes handles to out as CUDA's getters do: none when out is
// nil, else up to *n of them and NULL in the places after; *n becomes
// how many there are.
func handOut(ids []uint64, out *C.uintptr_t, n *C.size_t) {
	if out != nil && *n > 0 {
		dst := unsafe.Slice(out, int(min(uint64(*n), 1<<24)))
		for i := range dst {
			dst[i] = 0
			if i < len(ids) {
				dst[i] = C.uintptr_t(ids[i])
			}
		}
	}
	*n = C.size_t(len(ids))
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

// maxNodeList bounds a dependency list read from the program (CUDA sets no
// limit; a graph of more nodes than this is not a graph a program builds).
const maxNodeList = 1 << 20

// nodeList is the program's list of n node handles at p.
func nodeList(p *C.uintptr_t, n C.size_t) ([]uint64, bool) {
	if n == 0 {
		return nil, true
	}
	if p == nil || n > maxNodeList {
		return nil, false
	}
	ids := make([]uint64, n)
	for i, h := range unsafe.Slice(p, int(n)) {
		ids[i] = uint64(h)
	}
	return ids, true
}

// graphNodeOut adds a node (out set: to graph g after deps) or changes one
// (node of instantiated graph x, or x 0, of the graph holding it), by the
// add and set calls given.
func graphNodeOut(out *C.uintptr_t, g C.uintptr_t, deps *C.uintptr_t, nd C.size_t,
	add func(g uint64, deps []uint64) (uint64, cuapi.Result), set func() cuapi.Result) C.CUresult {
	if out == nil {
		return res(set())
	}
	ids, ok := nodeList(deps, nd)
	if !ok {
		return errInvalid
	}
	h, r := add(uint64(g), ids)
	return outHandle(out, h, r)
}

//export vgGraphKernelNode
func vgGraphKernelNode(out *C.uintptr_t, g, x, node C.uintptr_t, deps *C.uintptr_t, nd C.size_t, p *C.CUDA_KERNEL_NODE_PARAMS_v2) C.CUresult {
	f := uint64(uintptr(unsafe.Pointer(p._func)))
	if f == 0 {
		f = uint64(uintptr(unsafe.Pointer(p.kern))) // a CUkernel names its function too
	}
	params, packed, r := launchParams(f, (*unsafe.Pointer)(unsafe.Pointer(p.kernelParams)), (*unsafe.Pointer)(unsafe.Pointer(p.extra)))
	if r != 0 {
		return r
	}
	l := cuapi.Launch{Grid: [3]uint32{uint32(p.gridDimX), uint32(p.gridDimY), uint32(p.gridDimZ)},
		Block: [3]uint32{uint32(p.blockDimX), uint32(p.blockDimY), uint32(p.blockDimZ)}, SharedBytes: uint32(p.sharedMemBytes)}
	return graphNodeOut(out, g, deps, nd,
		func(g uint64, deps []uint64) (uint64, cuapi.Result) {
			return drv.GraphAddKernelNode(thread{}, g, deps, f, l, params, packed)
		},
		func() cuapi.Result {
			return drv.GraphSetKernel(thread{}, uint64(x), uint64(node), f, l, params, packed)
		})
}

//export vgGraphCopyNode
func vgGraphCopyNode(out *C.uintptr_t, g, x, node C.uintptr_t, deps *C.uintptr_t, nd C.size_t, p *C.CUDA_MEMCPY3D) C.CUresult {
	c, r := copyOf3D(p)
	if r != 0 {
		return r
	}
	return graphNodeOut(out, g, deps, nd,
		func(g uint64, deps []uint64) (uint64, cuapi.Result) {
			return drv.GraphAddCopyNode(thread{}, g, deps, c)
		},
		func() cuapi.Result { return drv.GraphSetCopy(thread{}, uint64(x), uint64(node), c) })
}

//export vgGraphMemsetNode
func vgGraphMemsetNode(out *C.uintptr_t, g, x, node C.uintptr_t, deps *C.uintptr_t, nd C.size_t, p *C.CUDA_MEMSET_NODE_PARAMS) C.CUresult {
	if p.height != 1 {
		return notServed("a memset node of more than one row")
	}
	if p.elementSize != 1 && p.elementSize != 2 && p.elementSize != 4 {
		return errInvalid
	}
	dst, width, v, count := uint64(p.dst), uint8(p.elementSize), uint32(p.value), uint64(p.width)
	return graphNodeOut(out, g, deps, nd,
		func(g uint64, deps []uint64) (uint64, cuapi.Result) {
			return drv.GraphAddMemsetNode(thread{}, g, deps, dst, width, v, count)
		},
		func() cuapi.Result {
			return drv.GraphSetMemset(thread{}, uint64(x), uint64(node), dst, width, v, count)
		})
}

//export vgGraphChildNode
func vgGraphChildNode(out *C.uintptr_t, g, x, node C.uintptr_t, deps *C.uintptr_t, nd C.size_t, child C.uintptr_t) C.CUresult {
	return graphNodeOut(out, g, deps, nd,
		func(g uint64, deps []uint64) (uint64, cuapi.Result) {
			return drv.GraphAddChildNode(g, deps, uint64(child))
		},
		func() cuapi.Result { return drv.GraphSetChild(uint64(x), uint64(node), uint64(child)) })
}

//export vgGraphEmptyNode
func vgGraphEmptyNode(out *C.uintptr_t, g C.uintptr_t, deps *C.uintptr_t, nd C.size_t) C.CUresult {
	return graphNodeOut(out, g, deps, nd, drv.GraphAddEmptyNode, func() cuapi.Result { return cuapi.Success })
}

//export vgGraphNodeSetEnabled
func vgGraphNodeSetEnabled(x, node C.uintptr_t, on C.uint) C.CUresult {
	return res(drv.GraphNodeSetEnabled(uint64(x), uint64(node), on != 0))
}

//export vgGraphNodeGetEnabled
func vgGraphNodeGetEnabled(x, node C.uintptr_t, on *C.uint) C.CUresult {
	v, r := drv.GraphNodeEnabled(uint64(x), uint64(node))
	if r == cuapi.Success {
		*on = 0
		if v {
			*on = 1
		}
	}
	return res(r)
}

//export vgGraphExecUpdate
func vgGraphExecUpdate(x, g C.uintptr_t, result *C.int, bad *C.uintptr_t) C.CUresult {
	v, node, r := drv.GraphExecUpdate(uint64(x), uint64(g))
	*result, *bad = C.int(v), C.uintptr_t(node)
	return res(r)
}

//export vgGraphNodeType
func vgGraphNodeType(node C.uintptr_t, t *C.int) C.CUresult {
	v, r := drv.GraphNodeType(uint64(node))
	return outInt(t, v, r)
}

//export vgGraphNodeDependencies
func vgGraphNodeDependencies(node C.uintptr_t, deps *C.uintptr_t, n *C.size_t) C.CUresult {
	ids, r := drv.GraphNodeDependencies(uint64(node))
	if r == cuapi.Success {
		handOut(ids, deps, n)
	}
	return res(r)
}

//export vgStreamBeginCaptureToGraph
func vgStreamBeginCaptureToGraph(s, g C.uintptr_t, deps *C.uintptr_t, nd C.size_t, mode C.int) C.CUresult {
	ids, ok := nodeList(deps, nd)
	if !ok || mode < 0 {
		return errInvalid
	}
	return res(drv.StreamBeginCaptureToGraph(thread{}, uint64(s), uint64(g), ids, uint32(mode)))
}

//export vgDeviceGraphMemTrim
func vgDeviceGraphMemTrim(dev C.CUdevice) C.CUresult { return res(drv.DeviceGraphMemTrim(int32(dev))) }

// notServed answers CUDA_ERROR_NOT_SUPPORTED for what, naming it with
// VGPUHA_DEBUG set.
func notServed(what string) C.CUresult {
	if C.vg_debug_enabled() > 0 {
		fmt.Fprintf(os.Stderr, "vgpuha libcuda: %s is not supported (CUDA_ERROR_NOT_SUPPORTED)\n", what)
	}
	return C.CUresult(cuapi.ErrorNotSupported)
}

// copyOf3D reads a CUDA_MEMCPY3D of one row (Height and Depth 1): each
// side's address at its offsets, device or host by its memory type (a
// unified address by where it lies). Arrays and several rows are not
// served.
func copyOf3D(p *C.CUDA_MEMCPY3D) (cuapi.Copy, C.CUresult) {
	if p.Height != 1 || p.Depth != 1 {
		return cuapi.Copy{}, notServed("a copy node of more than one row")
	}
	n := uint64(p.WidthInBytes)
	src, srcHost, r := copySide(p.srcMemoryType, unsafe.Pointer(p.srcHost), uint64(p.srcDevice), p.srcXInBytes, p.srcY, p.srcZ, p.srcPitch, p.srcHeight, n)
	if r != 0 {
		return cuapi.Copy{}, r
	}
	dst, dstHost, r := copySide(p.dstMemoryType, p.dstHost, uint64(p.dstDevice), p.dstXInBytes, p.dstY, p.dstZ, p.dstPitch, p.dstHeight, n)
	if r != 0 {
		return cuapi.Copy{}, r
	}
	return cuapi.Copy{Dst: dst, Src: src, DstHost: dstHost, SrcHost: srcHost, N: n}, 0
}

// copySide is one side of a copy: its device address, or its host bytes.
func copySide(kind C.int, host unsafe.Pointer, dev uint64, x, y, z, pitch, height C.size_t, n uint64) (uint64, []byte, C.CUresult) {
	off, ok := offset3D(uint64(x), uint64(y), uint64(z), uint64(pitch), uint64(height))
	if !ok {
		return 0, nil, errInvalid
	}
	switch kind {
	case C.CU_MEMORYTYPE_UNIFIED:
		if drv.IsDevice(dev+off, n) || drv.IsGlobal(dev+off, n) {
			return dev + off, nil, 0
		}
		host = C.vg_ptr(C.CUdeviceptr(dev))
	case C.CU_MEMORYTYPE_DEVICE:
		return dev + off, nil, 0
	case C.CU_MEMORYTYPE_HOST:
	default:
		return 0, nil, notServed("a copy node to or from an array")
	}
	if host == nil {
		return 0, nil, errInvalid
	}
	b, ok := hostBytes(unsafe.Add(host, off), C.size_t(n))
	if !ok {
		return 0, nil, errInvalid
	}
	return 0, b, 0
}

// offset3D is x + (y + z·height)·pitch, or false when it overflows.
func offset3D(x, y, z, pitch, height uint64) (uint64, bool) {
	hi, rows := bits.Mul64(z, height)
	if hi != 0 {
		return 0, false
	}
	rows += y
	if rows < y {
		return 0, false
	}
	hi, off := bits.Mul64(rows, pitch)
	if hi != 0 || off+x < off {
		return 0, false
	}
	return off + x, true
}

//export vgGraphRootNodes
func vgGraphRootNodes(g C.uintptr_t, nodes *C.uintptr_t, n *C.size_t) C.CUresult {
	ids, r := drv.GraphRootNodes(uint64(g))
	if r == cuapi.Success {
		handOut(ids, nodes, n)
	}
	return res(r)
}

//export vgGraphEdges
func vgGraphEdges(g C.uintptr_t, from, to *C.uintptr_t, n *C.size_t) C.CUresult {
	f, t, r := drv.GraphEdges(uint64(g))
	if r == cuapi.Success {
		m := *n
		handOut(f, from, &m)
		handOut(t, to, n)
	}
	return res(r)
}

// vgGraphKernelNodeShape sets a kernel node's launch attribute: what 1 its
// cooperative launch, 2 its cluster shape, 0 none (only checks the node).
//
//export vgGraphKernelNodeShape
func vgGraphKernelNodeShape(node C.uintptr_t, cx, cy, cz C.uint, coop C.int, what C.int) C.CUresult {
	var cluster *[3]uint32
	var cooperative *bool
	switch what {
	case 1:
		v := coop != 0
		cooperative = &v
	case 2:
		cluster = &[3]uint32{uint32(cx), uint32(cy), uint32(cz)}
	}
	return res(drv.GraphSetKernelShape(uint64(node), cluster, cooperative))
}
