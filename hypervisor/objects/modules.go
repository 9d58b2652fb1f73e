package objects

import (
	"github.com/vgpuha/vgpuha/handlemap"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/images"
	"github.com/vgpuha/vgpuha/hypervisor/internal/guesterr"
	"github.com/vgpuha/vgpuha/kernels"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// ModuleLoad loads an image the guest sent, and caches it.
func (o *Set) ModuleLoad(r *abi.ModuleLoad) (abi.Body, error) {
	img, err := abi.DecodeModuleImage(r.Image)
	if err != nil {
		return nil, guesterr.Fail(abi.StatusInvalidValue, "%w", err)
	}
	reply, err := o.loadImage(img)
	if err == nil {
		o.keepImage(abi.HashImage(r.Image), int64(len(r.Image)), img)
	}
	return reply, err
}

// ImageStage takes one piece of an image the guest uploads (package
// images, uploads.go); the load by hash that names it loads it. A standby
// applying the log takes the same pieces, counted by its primary.
func (o *Set) ImageStage(r *abi.ImageStage) (abi.Body, error) {
	return nil, o.uploads.Stage(r, !o.replaying)
}

// ownKernels is what a guest's own kernels need, as refusals say it.
const ownKernels = "--guest.kernels (with --guest.workers on each guest in a GPU worker of its own; with workers off, the default, one guest per primary: --guest.max-sessions 1)"

// checkGuestKernels refuses a module with a kernel that is not the
// library's own (by name, signature and PTX) unless the node lets guests
// bring their own (Config.GuestKernels: each in a GPU worker of its own,
// or one guest per process): the library's kernels have their
// arguments checked, a guest's own kernel can dereference any address of
// the process's contexts, other sessions' included.
func (o *Set) checkGuestKernels(img *abi.ModuleImage) error {
	if o.cfg.GuestKernels {
		return nil
	}
	if img.Format != abi.FormatKernels {
		return guesterr.Fail(abi.StatusNotSupported, "a %v image holds the guest's own machine code; it needs "+ownKernels, img.Format)
	}
	for _, spec := range img.Kernels {
		if !kernels.IsLibrary(spec) {
			return guesterr.Fail(abi.StatusNotSupported, "kernel %q is not a library kernel; guest-built kernels need "+ownKernels, spec.Name)
		}
	}
	return nil
}

// ModuleUnload unloads a module and forgets its functions.
func (o *Set) ModuleUnload(r *abi.ModuleUnload) (abi.Body, error) {
	h := handlemap.Handle(r.Module)
	m, err := o.handles.Lookup(handlemap.KindModule, h)
	if err != nil {
		return nil, guesterr.Fail(abi.StatusInvalidHandle, "%w", err)
	}
	if err := o.ctx.UnloadModule(gpu.Module(m)); err != nil {
		return nil, err
	}
	removed, _ := o.handles.Remove(handlemap.KindModule, h)
	for _, r := range removed {
		delete(o.kernels, r.Handle)
		delete(o.moduleImages, r.Handle)
	}
	return nil, nil
}

// GetFunction looks a kernel up in a loaded module.
func (o *Set) GetFunction(r *abi.GetFunction) (abi.Body, error) {
	mh := handlemap.Handle(r.Module)
	m, err := o.handles.Lookup(handlemap.KindModule, mh)
	if err != nil {
		return nil, guesterr.Fail(abi.StatusInvalidHandle, "%w", err)
	}
	img := o.moduleImages[mh]
	spec, ok := img.Kernel(r.Name)
	if !ok && img.Format == abi.FormatKernels {
		return nil, guesterr.Fail(abi.StatusInvalidValue, "module %d has no kernel %q", mh, r.Name)
	}
	if err := o.CheckRoom(); err != nil {
		return nil, err
	}
	f, err := o.ctx.Function(gpu.Module(m), r.Name)
	if err != nil {
		return nil, err
	}
	if img.Format != abi.FormatKernels {
		if spec, err = o.rawKernel(f, r.Name); err != nil {
			return nil, err
		}
	}
	h, err := o.handles.Insert(handlemap.KindFunction, uint64(f), mh)
	if err != nil {
		return nil, err
	}
	o.kernels[h] = spec
	return &abi.HandleReply{Handle: uint64(h)}, nil
}

// rawKernel declares a function taken from a raw image: every parameter
// is bytes, in the slots the backend that loaded the image reports.
func (o *Set) rawKernel(f gpu.Function, name string) (abi.KernelSpec, error) {
	layouter, ok := o.ctx.(gpu.FunctionDescriber)
	if !ok {
		return abi.KernelSpec{}, guesterr.Fail(abi.StatusNotSupported, "this GPU cannot report kernel %q's parameters", name)
	}
	slots, err := layouter.ParamSlots(f)
	if err != nil {
		return abi.KernelSpec{}, err
	}
	spec := abi.KernelSpec{Name: name, Slots: slots, Params: make([]abi.ArgKind, len(slots))}
	for i := range spec.Params {
		spec.Params[i] = abi.ArgBytes
	}
	return spec, nil
}

// FunctionParams reports a function's parameter slots (empty for a kernel
// whose module declared its parameters) and, where the GPU gives them, its
// attributes.
func (o *Set) FunctionParams(r *abi.FunctionParams) (abi.Body, error) {
	fh := handlemap.Handle(r.Function)
	f, err := o.handles.Lookup(handlemap.KindFunction, fh)
	if err != nil {
		return nil, guesterr.Fail(abi.StatusInvalidHandle, "%w", err)
	}
	reply := &abi.FunctionParamsReply{Slots: o.kernels[fh].Slots}
	if d, ok := o.ctx.(gpu.FunctionDescriber); ok {
		if reply.Attrs, err = d.FunctionAttrs(gpu.Function(f)); err != nil {
			return nil, err
		}
	}
	return reply, nil
}

// checkLoad refuses an image the session may not load now (whose kernels
// it may not run, or past its objects quota).
func (o *Set) checkLoad(img *abi.ModuleImage) error {
	if err := o.checkGuestKernels(img); err != nil {
		return err
	}
	return o.CheckRoom()
}

// loadImage loads a decoded image into the session's context.
func (o *Set) loadImage(img *abi.ModuleImage) (abi.Body, error) {
	if err := o.checkLoad(img); err != nil {
		return nil, err
	}
	m, err := o.ctx.LoadModule(img)
	if err != nil {
		return nil, err
	}
	h, err := o.handles.Insert(handlemap.KindModule, uint64(m), 0)
	if err != nil {
		o.ctx.UnloadModule(m)
		return nil, err
	}
	o.moduleImages[h] = img
	return &abi.HandleReply{Handle: uint64(h)}, nil
}

// ModuleLoadCached loads an image by hash: one the session uploaded in
// pieces (the log carried the same pieces to the standby, so its replica
// holds the upload too), else from the images the log carried when
// replaying, else from the cache (then, when replicating, making sure the
// standby will hold it too).
func (o *Set) ModuleLoadCached(r *abi.ModuleLoadCached) (abi.Body, error) {
	if img, enc, err := o.uploads.Take(r.Hash); img != nil || err != nil {
		if err != nil {
			return nil, err
		}
		reply, err := o.loadImage(img)
		if err == nil {
			o.keepImage(r.Hash, int64(len(enc)), img)
		}
		return reply, err
	}
	cache := o.cfg.Images
	if o.replaying {
		img := cache.Received(r.Hash)
		if img == nil {
			return nil, guesterr.Fail(abi.StatusUnknownImage, "no image %x was carried to this standby", r.Hash[:8])
		}
		return o.loadImage(img)
	}
	img, size := cache.Get(r.Hash, o.cfg.Tenant)
	if img != nil && o.log != nil && size > abi.MaxModuleImage {
		// Too large for one record: it reaches the standby as an upload
		// into this session's replica, which the load's record takes.
		if err := o.checkLoad(img); err != nil {
			return nil, err
		}
		images.ShipPieces(r.Hash, img, o.session, o.log)
	} else if img == nil || o.log != nil && !cache.Ship(r.Hash, img, o.cfg.Tenant, o.log) {
		return nil, guesterr.Fail(abi.StatusUnknownImage, "this node holds no image %x for tenant %s; send its bytes", r.Hash[:8], o.cfg.Tenant)
	}
	o.cfg.ImageBytes("cache", size)
	return o.loadImage(img)
}

// keepImage caches the image a load sent (size encoded bytes hashing to
// h), whole or uploaded.
func (o *Set) keepImage(h abi.ImageHash, size int64, img *abi.ModuleImage) {
	o.cfg.ImageBytes("guest", size)
	if o.replaying {
		return
	}
	o.cfg.Images.Put(h, img, size, o.cfg.Tenant)
}

// Occupancy answers an occupancy question about a function from the
// context's GPU driver (gpu.OccupancyCalculator); a context without one
// answers that it is not supported, and the guest's library then
// estimates.
func (o *Set) Occupancy(r *abi.Occupancy) (abi.Body, error) {
	f, err := o.handles.Lookup(handlemap.KindFunction, handlemap.Handle(r.Function))
	if err != nil {
		return nil, guesterr.Fail(abi.StatusInvalidHandle, "%w", err)
	}
	calc, ok := o.ctx.(gpu.OccupancyCalculator)
	if !ok {
		return nil, guesterr.Fail(abi.StatusNotSupported, "occupancy: the %T GPU has no occupancy calculator", o.ctx)
	}
	if r.Block.Count() == 0 || r.Block.Count() > gpu.MaxThreadsPerBlock {
		return nil, guesterr.Fail(abi.StatusInvalidValue, "occupancy: a block of %d threads", r.Block.Count())
	}
	v, err := calc.Occupancy(gpu.Function(f), r)
	if err != nil {
		return nil, err
	}
	return &abi.OccupancyReply{Value: v}, nil
}
