package cuapi

import (
	"encoding/binary"

	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Launch is one cuLaunchKernel's shape.
type Launch struct {
	Grid, Block [3]uint32
	SharedBytes uint32
	Stream      uint64
	// Cluster is the thread-block cluster shape (all zero: none).
	Cluster [3]uint32
	// Cooperative is cuLaunchCooperativeKernel's launch (or
	// cuLaunchKernelEx's COOPERATIVE attribute): every block resident at once.
	Cooperative bool
}

// ParamLayout is the byte size of each of f's parameters: what the C half
// reads behind each kernelParams pointer. Every launch asks, so the slice
// is the driver's own, not a copy: the caller must not change it.
func (d *Driver) ParamLayout(f uint64) ([]int, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	fn, r := d.function(f)
	if r != Success {
		return nil, r
	}
	return fn.sizes, Success
}

// LaunchKernel is cuLaunchKernel. Exactly one of params (each parameter's
// bytes, from kernelParams) and packed (the CU_LAUNCH_PARAM_BUFFER_POINTER
// buffer, from extra) is non-nil. Like CUDA it returns before the kernel
// runs; a fault surfaces at the next synchronization.
func (d *Driver) LaunchKernel(t Thread, f uint64, l Launch, params [][]byte, packed []byte) Result {
	n, r := d.kernelNode(t, f, l, params, packed)
	if r != Success {
		return r
	}
	c, st, r := d.copyTarget(t, l.Stream)
	if r != Success {
		return r
	}
	if d.recordLocked(l.Stream, n) {
		return Success
	}
	if r := d.beforeWork(c); r != Success {
		return r
	}
	n.cfg.Stream = st
	return resultOf("cuLaunchKernel", c.Launch(n.fn, n.cfg, n.args...), false)
}

// kernelNode checks a launch of f shaped l (its stream aside) and builds
// it: what cuLaunchKernel sends, a capture records and a kernel node holds.
func (d *Driver) kernelNode(t Thread, f uint64, l Launch, params [][]byte, packed []byte) (graphNode, Result) {
	d.mu.Lock()
	if _, r := d.current(t); r != Success {
		d.mu.Unlock()
		return graphNode{}, r
	}
	fn, r := d.function(f)
	maxThreads := d.attr(1)
	d.mu.Unlock()
	if r != Success {
		return graphNode{}, r
	}
	grid := abi.Dim3{X: l.Grid[0], Y: l.Grid[1], Z: l.Grid[2]}
	block := abi.Dim3{X: l.Block[0], Y: l.Block[1], Z: l.Block[2]}
	if grid.Count() == 0 || block.Count() == 0 {
		return graphNode{}, ErrorInvalidValue
	}
	if block.Count() > uint64(maxThreads) || l.SharedBytes > uint32(max(fn.maxDyn, 0)) {
		return graphNode{}, ErrorInvalidValue
	}
	args, r := fn.args(params, packed)
	if r != Success {
		return graphNode{}, r
	}
	cfg := pvdriver.LaunchConfig{Grid: grid, Block: block, SharedBytes: l.SharedBytes,
		Cluster: abi.Dim3{X: l.Cluster[0], Y: l.Cluster[1], Z: l.Cluster[2]}, Cooperative: l.Cooperative}
	args = d.mirrorArgs(t, args)
	return graphNode{kind: nodeLaunch, fn: fn.remote, cfg: cfg, args: args}, Success
}

// args builds the launch's arguments from either form.
func (fn *function) args(params [][]byte, packed []byte) ([]abi.Arg, Result) {
	if params == nil && len(packed) != fn.total {
		return nil, ErrorLaunchResources // NVIDIA's answer to a buffer of another size than the parameters'
	}
	if params != nil && len(params) != len(fn.offs) {
		return nil, ErrorInvalidValue
	}
	args := make([]abi.Arg, len(fn.offs))
	for i, size := range fn.sizes {
		raw := packed
		if params != nil {
			raw = params[i]
		} else {
			raw = packed[fn.offs[i]:]
		}
		if len(raw) < size {
			return nil, ErrorInvalidValue
		}
		raw = raw[:size]
		switch kind := fn.kinds[i]; kind {
		case abi.ArgBytes:
			args[i] = abi.Bytes(append([]byte(nil), raw...))
		case abi.ArgU32, abi.ArgF32:
			args[i] = abi.Arg{Kind: kind, Bits: uint64(binary.LittleEndian.Uint32(raw))}
		default:
			args[i] = abi.Arg{Kind: kind, Bits: binary.LittleEndian.Uint64(raw)}
		}
	}
	return args, Success
}

// Function attributes (CUfunction_attribute).
const (
	funcMaxThreads = iota
	funcSharedSize
	funcConstSize
	funcLocalSize
	funcNumRegs
	funcPTXVersion
	funcBinaryVersion
	funcCacheModeCA
	funcMaxDynamicShared
	funcCarveout
	funcAttrCount = 16 // CU_FUNC_ATTRIBUTE_MAX

	funcNonPortableCluster      = 14 // CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
	funcClusterSchedulingPolicy = 15 // CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE
)

// regsPerThread is what this driver says a kernel uses (the software GPU
// has no registers; a CUDA primary's real count awaits a query of its own).
const regsPerThread = 32

// FuncGetAttribute is cuFuncGetAttribute.
func (d *Driver) FuncGetAttribute(attr int32, f uint64) (int32, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	fn, r := d.function(f)
	if r != Success {
		return 0, r
	}
	if attr >= 0 && int(attr) < len(fn.attrs) && attr != funcMaxDynamicShared && attr != funcCarveout &&
		attr != funcNonPortableCluster && attr != funcClusterSchedulingPolicy {
		return fn.attrs[attr], Success // the primary's GPU said
	}
	switch attr {
	case funcMaxThreads:
		return d.attr(1), Success
	case funcNumRegs:
		return regsPerThread, Success
	case funcPTXVersion:
		return int32(fn.ptxVer), Success
	case funcBinaryVersion:
		return d.attr(75)*10 + d.attr(76), Success
	case funcMaxDynamicShared:
		return fn.maxDyn, Success
	case funcCarveout:
		return fn.carveup, Success
	case funcNonPortableCluster:
		if fn.nonPortable {
			return 1, Success
		}
		return 0, Success
	case funcClusterSchedulingPolicy:
		return fn.policy, Success
	}
	if attr < 0 || attr >= funcAttrCount {
		return 0, ErrorInvalidValue
	}
	return 0, Success // sizes of static shared, constant and local memory, cluster attributes
}

// FuncSetAttribute is cuFuncSetAttribute: the dynamic shared memory limit
// (up to the device's opt-in maximum) and the carveout preference.
func (d *Driver) FuncSetAttribute(f uint64, attr, v int32) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.ready(); r != Success {
		return r
	}
	fn := d.funcs[f]
	if fn == nil {
		return ErrorInvalidHandle
	}
	switch {
	case attr == funcMaxDynamicShared && v >= 0 && v <= max(d.attr(97), d.attr(8)):
		fn.maxDyn = v
	case attr == funcCarveout && v >= -1 && v <= 100:
		fn.carveup = v
	case attr == funcNonPortableCluster && (v == 0 || v == 1):
		fn.nonPortable = v == 1 // occupancy questions carry it; the node sets it for a launch of a larger cluster
	case attr == funcClusterSchedulingPolicy && v >= 0 && v <= 2:
		fn.policy = v // a hint to the GPU's scheduler, kept for the program to read
	default:
		return ErrorInvalidValue
	}
	d.changed()
	return Success
}

// activeBlocks is how many blocks of blockSize threads using smem bytes of
// shared memory fit on one multiprocessor (CUDA Occupancy Calculator's
// limits: threads, blocks, registers and shared memory per SM).
// Precondition: d.mu must be locked.
func (d *Driver) activeBlocks(blockSize int32, smem uint64) int32 {
	if blockSize <= 0 || blockSize > d.attr(1) {
		return 0
	}
	warps := (blockSize + 31) / 32
	n := min(d.attr(39)/(warps*32), max(d.attr(106), 1))
	if regs := warps * 32 * regsPerThread; regs > 0 && d.attr(82) > 0 {
		n = min(n, d.attr(82)/regs)
	}
	if smem > 0 {
		if smem > uint64(d.attr(81)) {
			return 0
		}
		n = min(n, int32(uint64(d.attr(81))/smem))
	}
	return max(n, 0)
}

// OccupancyMaxActiveBlocks is cuOccupancyMaxActiveBlocksPerMultiprocessor
// (and its WithFlags form).
func (d *Driver) OccupancyMaxActiveBlocks(f uint64, blockSize int32, smem uint64, flags uint32) (int32, Result) {
	d.mu.Lock()
	fn, r := d.function(f)
	d.mu.Unlock()
	if r != Success {
		return 0, r
	}
	return d.blocksPerSM(fn, blockSize, smem, flags)
}

// OccupancyMaxPotentialBlockSize is cuOccupancyMaxPotentialBlockSize: the
// block size (a multiple of the warp size, at most limit when limit > 0)
// that keeps the most threads resident, and the grid that fills the
// device with it. smemFor, when non-nil, is the program's callback giving
// the dynamic shared memory a block size needs; else smem applies.
func (d *Driver) OccupancyMaxPotentialBlockSize(f uint64, smemFor func(int32) uint64, smem uint64, limit int32) (minGrid, block int32, r Result) {
	d.mu.Lock()
	if r := d.ready(); r != Success {
		d.mu.Unlock()
		return 0, 0, r
	}
	fn := d.funcs[f]
	top, sms := d.attr(1), d.attr(16)
	d.mu.Unlock()
	if fn == nil {
		return 0, 0, ErrorInvalidHandle
	}
	if limit > 0 {
		top = min(top, limit)
	}
	bestThreads := int32(-1)
	for bs := top / 32 * 32; bs >= 32; bs -= 32 {
		need := smem
		if smemFor != nil {
			need = smemFor(bs) // the program's code: called without the lock
		}
		n, r := d.blocksPerSM(fn, bs, need, 0)
		if r != Success {
			return 0, 0, r
		}
		if n*bs > bestThreads {
			bestThreads, block, minGrid = n*bs, bs, n*sms
		}
	}
	return minGrid, block, Success
}
