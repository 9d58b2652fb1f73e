package cuda

import (
	"encoding/binary"
	"math"
	"runtime"
	"sync/atomic"
	"unsafe"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// The CUDA driver API's C surface: the function table that load fills
// with purego.RegisterLibFunc, and typed wrappers for the calls that take host memory by
// address, so the rest of the package passes slices and never converts a
// pointer.

type result int32

type driver struct {
	lost                          atomic.Pointer[Error] // the sticky error that ended this process's CUDA state
	cuInit                        func(flags uint32) result
	cuDriverGetVersion            func(v *int32) result
	cuDeviceGetCount              func(n *int32) result
	cuDeviceGet                   func(dev *int32, ordinal int32) result
	cuDeviceGetName               func(name *byte, n int32, dev int32) result
	cuDeviceGetAttribute          func(v *int32, attr int32, dev int32) result
	cuDeviceTotalMem              func(n *uint64, dev int32) result
	cuDeviceGetUuid               func(uuid *[16]byte, dev int32) result
	cuCtxCreate                   func(ctx *uintptr, flags uint32, dev int32) result
	cuCtxDestroy                  func(ctx uintptr) result
	cuCtxSetCurrent               func(ctx uintptr) result
	cuCtxSynchronize              func() result
	cuCtxGetLimit                 func(v *uint64, limit int32) result
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
	cuMemcpyDtoHAsync             func(dst unsafe.Pointer, src uint64, n uint64, s uintptr) result
	cuMemcpyDtoDAsync             func(dst, src, n uint64, s uintptr) result
	cuMemsetD8Async               func(dst uint64, v uint8, n uint64, s uintptr) result
	cuMemsetD16Async              func(dst uint64, v uint16, n uint64, s uintptr) result
	cuMemsetD32Async              func(dst uint64, v uint32, n uint64, s uintptr) result
	cuModuleLoadData              func(m *uintptr, image *byte) result
	cuModuleUnload                func(m uintptr) result
	cuModuleGetFunction           func(f *uintptr, m uintptr, name *byte) result
	cuFuncGetAttribute            func(v *int32, attr int32, f uintptr) result
	cuFuncSetAttribute            func(f uintptr, attr int32, v int32) result
	// Occupancy (optional: nil where the driver lacks them).
	cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags func(n *int32, f uintptr, block int32, smem uint64, flags uint32) result
	cuOccupancyMaxActiveClusters                         func(n *int32, f uintptr, cfg *launchConfig) result
	cuOccupancyMaxPotentialClusterSize                   func(n *int32, f uintptr, cfg *launchConfig) result
	cuModuleGetGlobal                                    func(addr, size *uint64, m uintptr, name *byte) result
	cuFuncGetParamInfo                                   func(f uintptr, index uint64, offset, size *uint64) result // nil before CUDA 12.4
	cuLaunchKernel                                       func(f uintptr, gx, gy, gz, bx, by, bz, shared uint32, s uintptr, params unsafe.Pointer, extra unsafe.Pointer) result
	cuLaunchKernelEx                                     func(cfg *launchConfig, f uintptr, params unsafe.Pointer, extra unsafe.Pointer) result // nil before CUDA 12
	cuTensorMapEncodeTiled                               func(m unsafe.Pointer, dataType, rank uint32, global uint64, dims, strides *uint64,
		box, elementStrides *uint32, interleave, swizzle, l2Promotion, oobFill uint32) result // nil before CUDA 12
	cuStreamCreate      func(s *uintptr, flags uint32) result
	cuStreamDestroy     func(s uintptr) result
	cuStreamSynchronize func(s uintptr) result
	cuEventCreate       func(ev *uintptr, flags uint32) result
	cuEventRecord       func(ev, s uintptr) result
	cuEventSynchronize  func(ev uintptr) result
	cuEventDestroy      func(ev uintptr) result
	cuMemAlloc          func(p *uint64, n uint64) result
	cuMemFree           func(p uint64) result
	cuMemAllocHost      func(p *unsafe.Pointer, n uint64) result
	cuMemHostAlloc      func(p *unsafe.Pointer, n uint64, flags uint32) result
	cuMemFreeHost       func(p unsafe.Pointer) result
	cuMemHostRegister   func(p unsafe.Pointer, n uint64, flags uint32) result
	cuMemHostUnregister func(p unsafe.Pointer) result
	cuGetErrorName      func(r result, s **byte) result
	cuGetErrorString    func(r result, s **byte) result
}

// memcpyHtoD copies src to device address dst (cuMemcpyHtoD_v2).
func (d *driver) memcpyHtoD(dst uint64, src []byte) result {
	return d.cuMemcpyHtoD(dst, unsafe.Pointer(unsafe.SliceData(src)), uint64(len(src)))
}

// memcpyHtoDAsync copies src to dst on stream s (cuMemcpyHtoDAsync_v2).
func (d *driver) memcpyHtoDAsync(dst uint64, src []byte, s uintptr) result {
	return d.cuMemcpyHtoDAsync(dst, unsafe.Pointer(unsafe.SliceData(src)), uint64(len(src)), s)
}

// memcpyDtoH copies len(dst) bytes from device address src (cuMemcpyDtoH_v2).
func (d *driver) memcpyDtoH(dst []byte, src uint64) result {
	return d.cuMemcpyDtoH(unsafe.Pointer(unsafe.SliceData(dst)), src, uint64(len(dst)))
}

// memcpyDtoHAsync copies len(dst) bytes from device address src on
// stream s (cuMemcpyDtoHAsync_v2); dst must stay put until s is
// synchronised.
func (d *driver) memcpyDtoHAsync(dst []byte, src uint64, s uintptr) result {
	return d.cuMemcpyDtoHAsync(unsafe.Pointer(unsafe.SliceData(dst)), src, uint64(len(dst)), s)
}

// launchKernel launches f (cuLaunchKernel, or cuLaunchKernelEx for a
// cluster launch). params[i] holds the bytes of the kernel's parameter i;
// kernelParams is an array of pointers, one per parameter, each to the
// parameter's value (CUDA Driver API), and the driver copies the values
// before it returns. A launch asking for more dynamic shared memory than a
// function gets by default (48 KiB) first raises the function's limit to
// it, as a program does with
// cuFuncSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
// before such a launch (the guest's library checked it against the
// device's opt-in maximum and the guest's own setting).
func (d *driver) launchKernel(f uintptr, cfg gpu.LaunchConfig, s uintptr, params [][]byte) result {
	if cfg.SharedBytes > defaultDynamicShared {
		if r := d.cuFuncSetAttribute(f, funcAttrMaxDynamicShared, int32(min(cfg.SharedBytes, math.MaxInt32))); r != 0 {
			return r
		}
	}
	ptrs := make([]unsafe.Pointer, len(params)+1)
	for i, p := range params {
		ptrs[i] = unsafe.Pointer(unsafe.SliceData(p))
	}
	g, b := cfg.Grid, cfg.Block
	var r result
	if cfg.Cluster == (abi.Dim3{}) && !cfg.Cooperative {
		r = d.cuLaunchKernel(f, g.X, g.Y, g.Z, b.X, b.Y, b.Z, cfg.SharedBytes, s, unsafe.Pointer(&ptrs[0]), nil)
	} else {
		r = d.launchEx(f, cfg, s, unsafe.Pointer(&ptrs[0]))
	}
	runtime.KeepAlive(params)
	runtime.KeepAlive(ptrs)
	return r
}

// launchConfig and launchAttribute are CUDA's CUlaunchConfig and
// CUlaunchAttribute (cuda.h, CUDA 12): a config points to its attributes;
// an attribute is its id, padding to 8 bytes, and a 64-byte value union.
type launchConfig struct {
	gridX, gridY, gridZ, blockX, blockY, blockZ, shared uint32
	_                                                   uint32
	stream                                              uintptr
	attrs                                               *launchAttribute
	numAttrs                                            uint32
	_                                                   uint32
}

type launchAttribute struct {
	id    uint32
	_     uint32
	value [64]byte
}

// CUlaunchAttributeID values (cuda.h): COOPERATIVE's value is an int,
// CLUSTER_DIMENSION's three unsigned ints.
const (
	launchAttrCooperative      = 2
	launchAttrClusterDimension = 4
)

// launchEx launches f through cuLaunchKernelEx with the attributes cfg
// asks for: thread-block clusters of cfg.Cluster's shape, a cooperative
// launch, or both.
func (d *driver) launchEx(f uintptr, cfg gpu.LaunchConfig, s uintptr, params unsafe.Pointer) result {
	if d.cuLaunchKernelEx == nil {
		return resultNotSupported
	}
	if c := cfg.Cluster; c.Count() > portableClusterSize {
		if r := d.cuFuncSetAttribute(f, funcAttrNonPortableCluster, 1); r != 0 { // as a program does before such a launch
			return r
		}
	}
	attrs := clusterAttrs(cfg.Cluster, 2)
	if cfg.Cooperative {
		a := launchAttribute{id: launchAttrCooperative}
		binary.LittleEndian.PutUint32(a.value[0:], 1)
		attrs = append(attrs, a)
	}
	lc := &launchConfig{gridX: cfg.Grid.X, gridY: cfg.Grid.Y, gridZ: cfg.Grid.Z, blockX: cfg.Block.X, blockY: cfg.Block.Y,
		blockZ: cfg.Block.Z, shared: cfg.SharedBytes, stream: s, attrs: unsafe.SliceData(attrs), numAttrs: uint32(len(attrs))}
	r := d.cuLaunchKernelEx(lc, f, params, nil)
	runtime.KeepAlive(attrs)
	runtime.KeepAlive(lc)
	return r
}

// clusterAttrs is a launch's attributes with room for n, holding
// CLUSTER_DIMENSION for cluster c unless c is zero (no cluster).
func clusterAttrs(c abi.Dim3, n int) []launchAttribute {
	attrs := make([]launchAttribute, 0, n)
	if c != (abi.Dim3{}) {
		a := launchAttribute{id: launchAttrClusterDimension}
		binary.LittleEndian.PutUint32(a.value[0:], c.X)
		binary.LittleEndian.PutUint32(a.value[4:], c.Y)
		binary.LittleEndian.PutUint32(a.value[8:], c.Z)
		attrs = append(attrs, a)
	}
	return attrs
}

// hasOccupancy reports whether the driver answers occupancy question k.
func (d *driver) hasOccupancy(k abi.OccupancyKind) bool {
	switch k {
	case abi.OccupancyBlocks:
		return d.cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags != nil
	case abi.OccupancyClusters:
		return d.cuOccupancyMaxActiveClusters != nil
	case abi.OccupancyClusterSize:
		return d.cuOccupancyMaxPotentialClusterSize != nil
	}
	return false
}

// occupancy asks the driver question q about f (a cluster question with
// a launch config of q's shape; a zero cluster shape leaves it to the
// function's own).
func (d *driver) occupancy(f uintptr, q *abi.Occupancy) (int32, error) {
	var n int32
	if q.Kind == abi.OccupancyBlocks {
		r := d.cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&n, f, int32(q.Block.Count()), uint64(q.SharedBytes), q.Flags)
		return n, d.check("cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", r)
	}
	attrs := clusterAttrs(q.Cluster, 1)
	lc := &launchConfig{gridX: q.Grid.X, gridY: q.Grid.Y, gridZ: q.Grid.Z, blockX: q.Block.X, blockY: q.Block.Y,
		blockZ: q.Block.Z, shared: q.SharedBytes, attrs: unsafe.SliceData(attrs), numAttrs: uint32(len(attrs))}
	call, name := d.cuOccupancyMaxActiveClusters, "cuOccupancyMaxActiveClusters"
	if q.Kind == abi.OccupancyClusterSize {
		call, name = d.cuOccupancyMaxPotentialClusterSize, "cuOccupancyMaxPotentialClusterSize"
	}
	r := call(&n, f, lc)
	runtime.KeepAlive(attrs)
	return n, d.check(name, r)
}

// memAllocHost allocates n bytes of page-locked host memory
// (cuMemAllocHost_v2); free it with memFreeHost.
func (d *driver) memAllocHost(n int) ([]byte, result) {
	var p unsafe.Pointer
	if r := d.cuMemAllocHost(&p, uint64(n)); r != 0 {
		return nil, r
	}
	return unsafe.Slice((*byte)(p), n), 0
}

// memHostAlloc allocates n bytes of page-locked host memory with flags
// (cuMemHostAlloc).
func (d *driver) memHostAlloc(n int, flags uint32) ([]byte, result) {
	var p unsafe.Pointer
	if r := d.cuMemHostAlloc(&p, uint64(n), flags); r != 0 {
		return nil, r
	}
	return unsafe.Slice((*byte)(p), n), 0
}

// memFreeHost frees memory from memAllocHost (cuMemFreeHost).
func (d *driver) memFreeHost(b []byte) result {
	return d.cuMemFreeHost(unsafe.Pointer(unsafe.SliceData(b)))
}

// memHostRegister page-locks b for the driver (cuMemHostRegister_v2,
// flags e.g. CU_MEMHOSTREGISTER_PORTABLE = 1); undo with memHostUnregister
// before b is unmapped.
func (d *driver) memHostRegister(b []byte, flags uint32) result {
	return d.cuMemHostRegister(unsafe.Pointer(unsafe.SliceData(b)), uint64(len(b)), flags)
}

// memHostUnregister undoes memHostRegister (cuMemHostUnregister).
func (d *driver) memHostUnregister(b []byte) result {
	return d.cuMemHostUnregister(unsafe.Pointer(unsafe.SliceData(b)))
}

// cstring copies the NUL-terminated C string at p (the driver's own
// static strings, such as error names).
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

// tensorMapAlign is CUtensorMap's alignment (cuda.h declares it
// alignas(64); the driver refuses a map that is not).
const tensorMapAlign = 64

// encodeTensorMapTiled calls cuTensorMapEncodeTiled into a 64-byte
// aligned buffer and returns the map's bytes.
func (d *driver) encodeTensorMapTiled(r *abi.TensorMapEncode) (mp [abi.TensorMapBytes]byte, err error) {
	var buf [abi.TensorMapBytes + tensorMapAlign]byte
	off := (tensorMapAlign - uintptr(unsafe.Pointer(&buf[0]))%tensorMapAlign) % tensorMapAlign
	res := d.cuTensorMapEncodeTiled(unsafe.Pointer(&buf[off]), r.DataType, r.Rank, r.Global, &r.Dims[0], &r.Strides[0],
		&r.Box[0], &r.ElementStrides[0], r.Interleave, r.Swizzle, r.L2Promotion, r.OOBFill)
	if err := d.check("cuTensorMapEncodeTiled", res); err != nil {
		return mp, err
	}
	copy(mp[:], buf[off:])
	return mp, nil
}
