package objects

import (
	"fmt"

	"github.com/vgpuha/vgpuha/handlemap"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/internal/guesterr"
	"github.com/vgpuha/vgpuha/kernels"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

func checkDims(grid, block, cluster abi.Dim3, shared, sharedLimit uint32) error {
	if grid.Count() == 0 || block.Count() == 0 {
		return guesterr.Fail(abi.StatusInvalidValue, "launch with an empty grid %v or block %v", grid, block)
	}
	if block.Count() > gpu.MaxThreadsPerBlock || block.Z > gpu.MaxBlockZ {
		return guesterr.Fail(abi.StatusInvalidValue, "block %v exceeds %d threads", block, gpu.MaxThreadsPerBlock)
	}
	if grid.X > gpu.MaxGridX || grid.Y > gpu.MaxGridYZ || grid.Z > gpu.MaxGridYZ {
		return guesterr.Fail(abi.StatusInvalidValue, "grid %v exceeds the device's limits", grid)
	}
	if shared > sharedLimit {
		return guesterr.Fail(abi.StatusInvalidValue, "%d bytes of shared memory, limit %d", shared, sharedLimit)
	}
	if cluster == (abi.Dim3{}) {
		return nil
	}
	if cluster.Count() == 0 || cluster.Count() > gpu.MaxClusterBlocks ||
		grid.X%cluster.X != 0 || grid.Y%cluster.Y != 0 || grid.Z%cluster.Z != 0 {
		return guesterr.Fail(abi.StatusInvalidValue, "cluster %v: want at most %d blocks that divide grid %v", cluster, gpu.MaxClusterBlocks, grid)
	}
	return nil
}

// sharedLimit is the most dynamic shared memory a launch may ask for.
func (o *Set) sharedLimit() uint32 {
	if l, ok := o.cfg.Backend.(gpu.SharedMemoryLimiter); ok {
		return max(l.MaxSharedBytesOptIn(), gpu.MaxSharedBytes)
	}
	return gpu.MaxSharedBytes
}

// Launch runs a kernel once every check has passed.
func (o *Set) Launch(r *abi.Launch) (abi.Body, error) {
	fh := handlemap.Handle(r.Function)
	f, err := o.handles.Lookup(handlemap.KindFunction, fh)
	if err != nil {
		return nil, guesterr.Fail(abi.StatusInvalidHandle, "%w", err)
	}
	st, err := o.Stream(r.Stream)
	if err != nil {
		return nil, err
	}
	if err := checkDims(r.Grid, r.Block, r.Cluster, r.SharedBytes, o.sharedLimit()); err != nil {
		return nil, err
	}
	spec := o.kernels[fh]
	if len(r.Args) != len(spec.Params) {
		return nil, guesterr.Fail(abi.StatusInvalidValue, "kernel %s takes %d arguments, launch gave %d", spec.Name, len(spec.Params), len(r.Args))
	}
	for i, a := range r.Args {
		if a.Kind != spec.Params[i] {
			return nil, guesterr.Fail(abi.StatusInvalidValue, "kernel %s argument %d: want kind %d, got %d", spec.Name, i, spec.Params[i], a.Kind)
		}
		if spec.Slots != nil && uint32(len(a.Raw)) != spec.Slots[i].Size {
			return nil, guesterr.Fail(abi.StatusInvalidValue, "kernel %s argument %d: %d bytes, the kernel takes %d", spec.Name, i, len(a.Raw), spec.Slots[i].Size)
		}
		if a.Kind == abi.ArgPtr && a.Bits != 0 {
			if !o.mem.Contains(a.Bits, 0) { // the message only for a refusal: it costs more than the check
				return nil, o.mem.CheckRange(a.Bits, 0, fmt.Sprintf("kernel %s argument %d", spec.Name, i))
			}
		}
	}
	if err := o.checkFootprint(spec, r); err != nil {
		return nil, err
	}
	args := r.Args
	if delta := o.mem.Delta(); delta != 0 { // pointer-typed arguments are translated; pointers stored in memory cannot be
		if why := untranslatable(spec); why != "" {
			return nil, guesterr.Fail(abi.StatusNotSupported, "kernel %s %s and this node's addresses differ from the primary's (by %#x): "+
				"its pointers cannot be translated; run each node in a process of its own, where windows get the same addresses",
				spec.Name, why, delta)
		}
		args = append([]abi.Arg(nil), r.Args...)
		for i := range args {
			if args[i].Kind == abi.ArgPtr && args[i].Bits != 0 {
				args[i].Bits += delta
			}
		}
	}
	args = o.localArgs(args) // module variables' addresses and tensor maps the guest holds from another node
	cfg := gpu.LaunchConfig{Grid: r.Grid, Block: r.Block, SharedBytes: r.SharedBytes, Cluster: r.Cluster, Cooperative: r.Cooperative}
	return nil, o.ctx.Launch(gpu.Function(f), cfg, args, st)
}

// untranslatable says why a kernel cannot run on a node whose addresses
// differ from the primary's ("" if it can): only pointer arguments are
// translated, so a guest's own kernel (its pointers are unknown) and a
// library kernel that follows pointers stored in memory (they are the
// primary's; on one GPU in one process they would reach the primary's
// memory) would reach the wrong memory, or none.
func untranslatable(spec abi.KernelSpec) string {
	k, ok := kernels.Lookup(spec.Name)
	switch {
	case !ok || !k.Matches(spec):
		return "is the guest's own"
	case k.FollowsPointers:
		return "follows pointers stored in device memory"
	}
	return ""
}

// checkFootprint checks, before any backend runs a library kernel, that
// all the memory the launch reaches through its pointer arguments lies in
// this session's allocations: a GPU runs the kernel's code unchecked. A
// kernel that follows pointers stored in memory reaches further than that,
// so it runs only where the backend checks every access, runs each
// session in a process of its own (gpu.ProcessIsolator) or the process
// serves one guest (Config.GuestKernels). Guest-built kernels (allowed only
// with one guest per process) are not checked.
func (o *Set) checkFootprint(spec abi.KernelSpec, r *abi.Launch) error {
	k, ok := kernels.Lookup(spec.Name)
	if !ok || !k.Matches(spec) {
		return nil // a guest's own kernel: checkGuestKernels let it in
	}
	l := kernels.Launch{Grid: r.Grid, Block: r.Block, SharedBytes: r.SharedBytes, Args: r.Args}
	// A launch that would reach outside is refused before it runs, with
	// the status a GPU gives a kernel that faults (an illegal address).
	extents, err := k.Footprint(l, o.footprint)
	o.footprint = extents
	if err != nil {
		return guesterr.Fail(abi.StatusLaunchFailed, "%w", err)
	}
	for _, e := range extents {
		if e.Bytes != 0 && !o.mem.Contains(r.Args[e.Arg].Bits, e.Bytes) {
			return guesterr.Fail(abi.StatusLaunchFailed, "kernel %s: %s: %d bytes at %#x are not inside one of this session's allocations",
				spec.Name, e.What, e.Bytes, r.Args[e.Arg].Bits)
		}
	}
	isolated := o.cfg.GuestKernels || gpu.IsolatesContexts(o.cfg.Backend)
	if checker, ok := o.cfg.Backend.(gpu.AccessChecker); k.FollowsPointers && !isolated && (!ok || !checker.ChecksEveryAccess()) {
		return guesterr.Fail(abi.StatusNotSupported, "kernel %s follows pointers stored in device memory, which this GPU does not check; "+
			"it needs GPU workers (--guest.workers on) or a primary per guest (--guest.kernels with --guest.max-sessions 1)", spec.Name)
	}
	return nil
}
