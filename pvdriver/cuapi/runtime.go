package cuapi

// What the CUDA runtime (cudart) and the libraries over it (cuBLAS,
// PyTorch) ask of the driver beyond NVIDIA's driver-API samples: context
// flags and limits, the primary context's state, stream attributes,
// libraries and kernels (CUDA 12's context-independent modules), pointer
// attributes. Where this driver keeps a value the GPU never sees (a limit,
// a stream priority), the function says so.

import "github.com/vgpuha/vgpuha/pvdriver/abi"

// CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: a function's static shared memory.
const funcSharedSizeBytes = 1

// Context limits (CUlimit): a new context's values come from the node's
// GPU (abi.DeviceInfoReply.Limits); these answer where the node does not
// say (a software GPU): CUDA's documented defaults.
var defaultLimits = map[int32]uint64{
	0: 1024,    // CU_LIMIT_STACK_SIZE
	1: 1 << 20, // CU_LIMIT_PRINTF_FIFO_SIZE
	2: 8 << 20, // CU_LIMIT_MALLOC_HEAP_SIZE
	3: 2,       // CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH
	4: 2048,    // CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT
	5: 32,      // CU_LIMIT_MAX_L2_FETCH_GRANULARITY
	6: 0,       // CU_LIMIT_PERSISTING_L2_CACHE_SIZE
}

// CtxGetLimit is cuCtxGetLimit.
func (d *Driver) CtxGetLimit(t Thread, limit int32) (uint64, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ctx, r := d.current(t)
	if r != Success {
		return 0, r
	}
	switch limit {
	case limitShmemSize: // an ordinary context's kernels have the device's shared memory
		return uint64(max(d.attr(97), 0)), Success // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
	case limitCIGEnabled, limitCIGShmemFallback: // no context here shares the GPU with graphics (CIG)
		return 0, Success
	}
	v, ok := defaultLimits[limit]
	if node := d.dev.Limits; int(limit) >= 0 && int(limit) < len(node) { // the node's GPU says
		v, ok = node[limit], node[limit] != abi.LimitUnsupported
	}
	if !ok {
		return 0, ErrorUnsupportedLimit
	}
	if set, ok := d.ctxs[ctx].limits[limit]; ok {
		v = set
	}
	return v, Success
}

// The limits CUDA 12.4 added for contexts in graphics interop (CIG):
// CU_LIMIT_SHMEM_SIZE, CU_LIMIT_CIG_ENABLED,
// CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED. They are read-only here.
const (
	limitShmemSize        = 7
	limitCIGEnabled       = 8
	limitCIGShmemFallback = 9
)

// CtxSetLimit is cuCtxSetLimit. The value is kept and reported back; the
// primary's GPU runs kernels with its own context's limits, so a kernel
// that needs a larger stack or heap than the defaults fails there.
func (d *Driver) CtxSetLimit(t Thread, limit int32, v uint64) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	ctx, r := d.current(t)
	if r != Success {
		return r
	}
	if _, ok := defaultLimits[limit]; !ok {
		return ErrorUnsupportedLimit
	}
	c := d.ctxs[ctx]
	if c.limits == nil {
		c.limits = map[int32]uint64{}
	}
	c.limits[limit] = v
	return Success
}

// CtxGetFlags is cuCtxGetFlags.
func (d *Driver) CtxGetFlags(t Thread) (uint32, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ctx, r := d.current(t)
	if r != Success {
		return 0, r
	}
	return d.ctxs[ctx].flags, Success
}

// CtxSetFlags is cuCtxSetFlags (scheduling flags only, as in CUDA).
func (d *Driver) CtxSetFlags(t Thread, flags uint32) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	ctx, r := d.current(t)
	if r != Success {
		return r
	}
	if flags&^ctxSchedMask != 0 {
		return ErrorInvalidValue
	}
	d.ctxs[ctx].flags = flags
	return Success
}

// CU_CTX_SCHED_MASK and CU_CTX_MAP_HOST | CU_CTX_LMEM_RESIZE_TO_MAX, the
// flags a primary context may be given.
const (
	ctxSchedMask    = 0x07
	ctxPrimaryFlags = ctxSchedMask | 0x08 | 0x10
)

// CtxLive checks that ctx is a context of this process (zero: the calling
// thread's current one) and returns it.
func (d *Driver) CtxLive(t Thread, ctx uint64) (uint64, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if ctx == 0 {
		return d.current(t)
	}
	return ctx, d.context(ctx, false)
}

// PrimaryCtxGetState is cuDevicePrimaryCtxGetState.
func (d *Driver) PrimaryCtxGetState(dev int32) (flags uint32, active bool, r Result) {
	if r := d.device(dev); r != Success {
		return 0, false, r
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.primaryFlags, d.primary != nil, Success
}

// PrimaryCtxSetFlags is cuDevicePrimaryCtxSetFlags_v2: the flags the
// primary context has now or gets when it is made.
func (d *Driver) PrimaryCtxSetFlags(dev int32, flags uint32) Result {
	if r := d.device(dev); r != Success {
		return r
	}
	if flags&^ctxPrimaryFlags != 0 {
		return ErrorInvalidValue
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.primaryFlags = flags
	if d.primary != nil {
		d.primary.flags = flags
	}
	d.changed()
	return Success
}

// StreamInfo is what cuStreamGetFlags, cuStreamGetCtx and cuStreamGetId
// answer for s (the null, legacy and per-thread streams: the calling
// thread's context, flags 0, and their own handle values as ids).
func (d *Driver) StreamInfo(t Thread, s uint64) (flags uint32, ctx uint64, r Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if s == 0 || s == streamLegacy || s == streamPerThread {
		ctx, r = d.current(t)
		return 0, ctx, r
	}
	if r := d.ready(); r != Success {
		return 0, 0, r
	}
	st := d.streams[s]
	if st == nil {
		return 0, 0, ErrorInvalidHandle
	}
	return st.flags, st.ctx, Success
}

// LibraryLoadData is cuLibraryLoadData: a library is a module loaded into
// the calling thread's context or, where the thread has none yet, into the
// device's primary context (CUDA loads libraries into every context; this
// driver's processes have one device and use one context each for their
// kernels). Its kernels are its functions.
func (d *Driver) LibraryLoadData(t Thread, img []byte) (uint64, Result) {
	ctx := t.Top()
	if ctx == 0 {
		ctx = d.PrimaryCtxHandle()
	}
	if ctx == 0 {
		return 0, ErrorInvalidContext
	}
	return d.LoadLibrary(ctx, img)
}

// Memory kinds (CUmemorytype) and pointer attributes (CUpointer_attribute).
const (
	MemoryHost   = 1
	MemoryDevice = 2
)

// PointerInfo describes what p points into: device memory this process
// allocated, a module variable it took the address of, or host memory it
// got from cuMemAllocHost/cuMemHostAlloc or registered with cuMemHostRegister.
type PointerInfo struct {
	Kind       uint32 // MemoryHost or MemoryDevice; 0: memory this driver does not know
	Ctx        uint64
	Base, Size uint64 // the allocation holding p
	ReadOnly   bool   // host memory registered read-only
}

// Pointer is what cuPointerGetAttribute(s) know of p.
func (d *Driver) Pointer(p uint64) (PointerInfo, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.ready(); r != Success {
		return PointerInfo{}, r
	}
	for base, a := range d.allocs {
		if p >= base && p-base < a.size {
			return PointerInfo{Kind: MemoryDevice, Ctx: a.ctx, Base: base, Size: a.size}, Success
		}
	}
	if info, ok := d.mappedPointer(p); ok {
		return info, Success
	}
	if g, off, ok := d.globalAt(p, 1); ok {
		return PointerInfo{Kind: MemoryDevice, Ctx: d.modules[g.module].ctx, Base: p - off, Size: g.size}, Success
	}
	if base, h, ok := d.hostAt(uintptr(p)); ok {
		return PointerInfo{Kind: MemoryHost, Ctx: h.ctx, Base: uint64(base), Size: h.size, ReadOnly: h.readOnly}, Success
	}
	return PointerInfo{}, Success
}

// FuncName is cuFuncGetName: the name f was taken by.
func (d *Driver) FuncName(f uint64) (string, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	fn, r := d.function(f)
	if r != Success {
		return "", r
	}
	return fn.name, Success
}

// ParamInfo is cuFuncGetParamInfo's answer for every parameter of f: its
// offset and size in the packed parameter buffer.
func (d *Driver) ParamInfo(f uint64) (offs, sizes []int, r Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	fn, r := d.function(f)
	if r != Success {
		return nil, nil, r
	}
	return append([]int(nil), fn.offs...), append([]int(nil), fn.sizes...), Success
}

// PrimaryCtxHandle is the primary context's handle, zero while it does
// not exist.
func (d *Driver) PrimaryCtxHandle() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.primary == nil {
		return 0
	}
	return d.primary.handle
}

// OccupancyAvailableDynamicSMem is cuOccupancyAvailableDynamicSMemPerBlock:
// the most dynamic shared memory each of numBlocks blocks of blockSize
// threads may use with all of them resident on one multiprocessor (0 when
// they cannot all be: too many threads), by the same limits as
// activeBlocks, less the function's static shared memory, at most the
// per-block opt-in maximum.
func (d *Driver) OccupancyAvailableDynamicSMem(f uint64, numBlocks, blockSize int32) (uint64, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	fn, r := d.function(f)
	if r != Success {
		return 0, r
	}
	if numBlocks <= 0 || blockSize <= 0 {
		return 0, ErrorInvalidValue
	}
	if d.activeBlocks(blockSize, 0) < numBlocks {
		return 0, Success
	}
	var static uint64
	if len(fn.attrs) > funcSharedSizeBytes {
		static = uint64(max(fn.attrs[funcSharedSizeBytes], 0)) // the primary's GPU said
	}
	perBlock := uint64(d.attr(81)) / uint64(numBlocks) // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
	if reserved := uint64(max(d.attr(111), 0)); perBlock > reserved {
		perBlock -= reserved // CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK
	} else {
		perBlock = 0
	}
	perBlock = min(perBlock, uint64(max(d.attr(97), 0))) // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
	if perBlock < static {
		return 0, Success
	}
	return perBlock - static, Success
}

// function resolves a CUfunction (or CUkernel) handle.
// Precondition: d.mu must be locked.
func (d *Driver) function(f uint64) (*function, Result) {
	if r := d.ready(); r != Success {
		return nil, r
	}
	fn := d.funcs[f]
	if fn == nil {
		return nil, ErrorInvalidHandle
	}
	return fn, d.describe(fn)
}
