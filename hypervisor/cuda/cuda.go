// Package cuda is a gpu.Backend on a real NVIDIA GPU through the CUDA
// driver API, loaded at run time (see driver.go; the C surface, and with it
// every use of unsafe, is driver_unsafe.go).
//
// Each guest session gets its own CUDA context. A context is current per OS
// thread (calls from a thread where it is not current fail with
// CUDA_ERROR_INVALID_CONTEXT, seen as error 201), so every call locks the
// calling goroutine to its thread and makes the context current there with
// cuCtxSetCurrent, under the context's mutex. (The alternative, one
// goroutine per context fed through a channel, was measured on an H100:
// that hand-off between threads cost more than the CUDA calls themselves,
// 31 µs for a 64-byte cuMemcpyHtoD, while cuCtxSetCurrent is a
// thread-local store.) Launches are the exception once a guest drives the
// context (gpu.LaunchPipeliner): they go to a launcher thread of the
// context's own, which every other call waits for (launcher.go). An
// overlapping device-to-device copy moves as memmove does (move.go).
// The session's device-address window is reserved with cuMemAddressReserve at
// the base the hypervisor asks for; the driver treats that address as a hint,
// so the base it really got is reported by Window and the caller translates
// when it differs. Allocations are physical memory created with cuMemCreate
// and mapped at the allocator's addresses with cuMemMap + cuMemSetAccess;
// Free unmaps and releases them, returning the memory.
//
// Resync snapshots (gpu.Snapshotter) are device-to-device copies into
// staging memory, taken with the session stopped (snapshot.go). A replica
// may leave its copies queued and settle them later (gpu.QueuedCopier,
// queued.go). A backend can keep contexts made ahead, so a new session
// does not wait ~100 ms for cuCtxCreate (spares.go).
//
// A Backend is one device (New, by ordinal); a node serving several opens
// one per ordinal (Devices lists the host's, with their UUIDs). They share
// the process's driver state, so a fault that loses it (Healthy) is every
// one's.
//
// Isolation note: contexts of one process share its GPU virtual address
// space, so a kernel with a wild pointer could reach another session's
// mapping in the same process. The hypervisor checks every pointer argument
// and only library kernels run on the software GPU; on CUDA, run untrusted
// guests in separate primary processes (one per guest) for hard isolation.
package cuda

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Backend is one CUDA device.
type Backend struct {
	hostMu  sync.Mutex
	hostCtx uintptr // a context for host-memory allocations, made on first use
	d       *driver
	dev     int32
	gran    uint64
	devName string
	version int32
	spares  *spares // contexts made ahead (spares.go), if kept
	// sharedOptIn is the dynamic shared memory a block may opt in to
	// (CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN).
	sharedOptIn uint32
	// limits are a new context's CUlimit values (abi.DeviceInfoReply.Limits).
	limits []uint64
	// uuid names the GPU to the host's NVML, which nvml reads its live
	// state from (nvml.go).
	uuid   [16]byte
	nvml   nvmlDevice
	status statusCache // the last reading of nvml, for statusFresh
	// ctxFlags are the guest contexts' cuCtxCreate flags (BlockWhileWaiting).
	ctxFlags uint32
}

// ctxSchedBlockingSync is CU_CTX_SCHED_BLOCKING_SYNC: a thread waiting
// for the context's work sleeps on the driver's event instead of spinning.
const ctxSchedBlockingSync = 0x04

// BlockWhileWaiting makes the contexts made from now on put a thread that
// waits for their work to sleep, not spin (CUDA's default while a process
// has fewer contexts than CPUs). A GPU worker serves one guest's context:
// with sixteen guests' workers and their standby's on one H200 host, the
// workers took 14 of its 32 CPUs, most of it waiting for the GPU, while
// the guests' own processes were left half of theirs and the GPU idle a
// fifth of the time. It costs a wait the wake-up (microseconds).
func (b *Backend) BlockWhileWaiting() { b.ctxFlags = ctxSchedBlockingSync }

// contextLimits is how many CUlimit values DeviceInfo reports: the stack
// size to the persisting L2 cache size (0–6); the later ones are a
// graphics-interop context's, which the guest's library answers itself.
const contextLimits = 7

// MaxSharedBytesOptIn implements gpu.SharedMemoryLimiter.
func (b *Backend) MaxSharedBytesOptIn() uint32 { return b.sharedOptIn }

// New opens CUDA device ordinal. It fails with ErrNoDriver where libcuda is
// absent.
func New(ordinal int) (*Backend, error) {
	d, err := load()
	if err != nil {
		return nil, err
	}
	b := &Backend{d: d}
	err = onThread(func() error {
		if err := d.check("cuInit", d.cuInit(0)); err != nil {
			return err
		}
		d.cuDriverGetVersion(&b.version)
		if err := d.check("cuDeviceGet", d.cuDeviceGet(&b.dev, int32(ordinal))); err != nil {
			return err
		}
		name := make([]byte, 256)
		d.cuDeviceGetName(&name[0], int32(len(name)), b.dev)
		b.devName = cstring(&name[0])
		d.cuDeviceGetUuid(&b.uuid, b.dev)
		var optIn int32
		if d.cuDeviceGetAttribute(&optIn, attrMaxSharedOptIn, b.dev) == 0 && optIn > 0 {
			b.sharedOptIn = uint32(optIn)
		}
		prop := b.prop()
		if err := d.check("cuMemGetAllocationGranularity", d.cuMemGetAllocationGranularity(&b.gran, &prop, 0)); err != nil {
			return err
		}
		return b.readLimits()
	})
	if err != nil {
		return nil, err
	}
	return b, nil
}

// Devices lists the host's GPUs by CUDA ordinal, each one's UUID
// (cuDeviceGetCount, then cuDeviceGet and cuDeviceGetUuid per ordinal:
// CUDA Driver API, "Device Management"), so a node can serve them all
// (--backend cuda:all) or those a UUID names. It fails with ErrNoDriver
// where libcuda is absent.
func Devices() ([][16]byte, error) {
	d, err := load()
	if err != nil {
		return nil, err
	}
	var uuids [][16]byte
	err = onThread(func() error {
		if err := d.check("cuInit", d.cuInit(0)); err != nil {
			return err
		}
		var n int32
		if err := d.check("cuDeviceGetCount", d.cuDeviceGetCount(&n)); err != nil {
			return err
		}
		uuids = make([][16]byte, n)
		for ord := range n {
			var dev int32
			if err := d.check("cuDeviceGet", d.cuDeviceGet(&dev, ord)); err != nil {
				return err
			}
			if err := d.check("cuDeviceGetUuid", d.cuDeviceGetUuid(&uuids[ord], dev)); err != nil {
				return err
			}
		}
		return nil
	})
	return uuids, err
}

// readLimits reads a new context's limits into b.limits, in a context made
// for it on this (locked) thread.
func (b *Backend) readLimits() error {
	var ctx uintptr
	if err := b.d.check("cuCtxCreate_v2", b.d.cuCtxCreate(&ctx, 0, b.dev)); err != nil {
		return err
	}
	defer b.d.cuCtxDestroy(ctx)
	b.limits = make([]uint64, contextLimits)
	for l := range b.limits {
		if b.d.cuCtxGetLimit(&b.limits[l], int32(l)) != 0 {
			b.limits[l] = abi.LimitUnsupported
		}
	}
	return nil
}

// onThread runs fn on a fresh locked OS thread.
func onThread(fn func() error) error {
	ch := make(chan error)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		ch <- fn()
	}()
	return <-ch
}

func (b *Backend) prop() memAllocationProp {
	return memAllocationProp{typ: 1, locationType: 1, locationID: b.dev}
}

// Name implements gpu.Backend.
func (b *Backend) Name() string { return "cuda" }

// Device describes the GPU.
func (b *Backend) Device() string {
	return fmt.Sprintf("%s (driver API %d.%d, allocation granularity %d KiB)", b.devName, b.version/1000, b.version%1000/10, b.gran>>10)
}

// Close implements gpu.Backend: spare contexts are destroyed (those given
// out are their sessions' to close).
func (b *Backend) Close() error {
	b.closeSpares()
	return nil
}

// DeviceInfo implements gpu.DeviceDescriber: the device's name, memory,
// UUID and every CUdevice_attribute the driver answers (cuDeviceGetAttribute;
// an attribute this driver does not know reads as zero).
func (b *Backend) DeviceInfo() (abi.DeviceInfoReply, error) {
	r := abi.DeviceInfoReply{Name: b.devName, Attrs: make([]int32, gpu.DeviceAttrCount), Granularity: b.gran, Limits: b.limits}
	err := onThread(func() error {
		if err := b.d.check("cuDeviceTotalMem_v2", b.d.cuDeviceTotalMem(&r.TotalMem, b.dev)); err != nil {
			return err
		}
		if err := b.d.check("cuDeviceGetUuid", b.d.cuDeviceGetUuid(&r.UUID, b.dev)); err != nil {
			return err
		}
		for a := 1; a < gpu.DeviceAttrCount; a++ {
			var v int32
			if b.d.cuDeviceGetAttribute(&v, int32(a), b.dev) == 0 {
				r.Attrs[a] = v
			}
		}
		return nil
	})
	return r, err
}

// Healthy implements gpu.HealthReporter: an error once a guest's kernel
// fault has ended this process's CUDA state (no new guest can be served;
// the node must be restarted, which a supervisor does on its exit).
func (b *Backend) Healthy() error {
	if err := b.d.Lost(); err != nil {
		return fmt.Errorf("%w: this process's CUDA state was lost to a guest kernel's fault (%v); CUDA cannot recover a process from that: restart the node",
			abi.StatusNotSupported, err)
	}
	return nil
}

// NewContext implements gpu.Backend.
func (b *Backend) NewContext(base, size uint64) (gpu.Context, error) {
	if err := b.Healthy(); err != nil {
		return nil, err
	}
	c := &guestContext{
		b: b, d: b.d, size: size,
		allocs:    map[uint64]mapping{},
		modules:   map[gpu.Module]*loadedModule{},
		functions: map[gpu.Function]uintptr{},
		streams:   map[gpu.Stream]uintptr{},
	}
	d := b.d
	c.ctx = b.takeSpare() // spares.go
	err := onThread(func() error {
		if c.ctx == 0 {
			if err := d.check("cuCtxCreate", d.cuCtxCreate(&c.ctx, b.ctxFlags, b.dev)); err != nil {
				return err
			}
		} else if err := d.check("cuCtxSetCurrent", d.cuCtxSetCurrent(c.ctx)); err != nil {
			d.cuCtxDestroy(c.ctx)
			return err
		}
		var got uint64
		if err := d.check("cuMemAddressReserve", d.cuMemAddressReserve(&got, c.reserved(), 0, base, 0)); err != nil {
			d.cuCtxDestroy(c.ctx)
			return err
		}
		c.base = got
		return nil
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

type mapping struct {
	size   uint64 // rounded to the granularity
	handle uint64
}

// guestContext is one guest session's gpu.Context: a CUDA context, the
// address window reserved in it, and the guest's allocations and handles.
type guestContext struct {
	b *Backend
	d *driver

	mu        sync.Mutex // held for every call; guards everything below
	ctx       uintptr
	base      uint64
	size      uint64
	allocs    map[uint64]mapping
	modules   map[gpu.Module]*loadedModule
	functions map[gpu.Function]uintptr
	streams   map[gpu.Stream]uintptr
	nextID    uint64
	// The checksum kernel and its 8-byte result, made on first use.
	sumMod, sumFn uintptr
	sumOut        uint64
	snap          *memSnapshot // the live memory snapshot (snapshot.go), if any
	moveBuf       uint64       // staging for overlapping copies (move.go), made on first use
	launches      *launcher    // queued launches' thread, once PipelineLaunches (launcher.go)
	// queued: a copy was queued since the last mark (QueueCopyHtoD);
	// marks are events recorded after queued copies (queued.go).
	queued bool
	marks  []queuedMark
}

// reserved is the window's reservation: whole granules (the driver
// answers INVALID_VALUE to any other size), while the guest keeps the size
// it asked for (c.size).
func (c *guestContext) reserved() uint64 {
	g := max(c.b.gran, 1)
	return (c.size + g - 1) / g * g
}

// do runs fn with the context current on the calling thread, after every
// queued launch (launcher.go).
func (c *guestContext) do(fn func() error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.launches != nil {
		c.launches.drain()
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := c.d.check("cuCtxSetCurrent", c.d.cuCtxSetCurrent(c.ctx)); err != nil {
		return err
	}
	return fn()
}

func (c *guestContext) Window() (uint64, uint64) { return c.base, c.size }

func roundUp(v, a uint64) uint64 { return (v + a - 1) / a * a }

func (c *guestContext) inWindow(addr, n uint64) error {
	if addr < c.base || n > c.size || addr-c.base > c.size-n {
		return fmt.Errorf("%w: [%#x, +%d) is outside the context's window", abi.StatusOutOfRange, addr, n)
	}
	return nil
}

func (c *guestContext) Alloc(addr, size uint64) error {
	return c.do(func() error {
		d := c.d
		rounded := roundUp(size, c.b.gran)
		if addr%c.b.gran != 0 {
			return fmt.Errorf("%w: address %#x is not aligned to the %d-byte granularity", abi.StatusInvalidValue, addr, c.b.gran)
		}
		if err := c.inWindow(addr, rounded); err != nil {
			return err
		}
		prop := c.b.prop()
		var h uint64
		if err := d.check("cuMemCreate", d.cuMemCreate(&h, rounded, &prop, 0)); err != nil {
			return err
		}
		if err := d.check("cuMemMap", d.cuMemMap(addr, rounded, 0, h, 0)); err != nil {
			d.cuMemRelease(h)
			return err
		}
		desc := memAccessDesc{locationType: 1, locationID: c.b.dev, flags: 3}
		if err := d.check("cuMemSetAccess", d.cuMemSetAccess(addr, rounded, &desc, 1)); err != nil {
			d.cuMemUnmap(addr, rounded)
			d.cuMemRelease(h)
			return err
		}
		c.allocs[addr] = mapping{size: rounded, handle: h}
		return nil
	})
}

func (c *guestContext) Free(addr uint64) error {
	return c.do(func() error { return c.free(addr) })
}

func (c *guestContext) free(addr uint64) error {
	m, ok := c.allocs[addr]
	if !ok {
		return fmt.Errorf("%w: no allocation at %#x", abi.StatusInvalidValue, addr)
	}
	c.d.cuCtxSynchronize()
	if err := c.d.check("cuMemUnmap", c.d.cuMemUnmap(addr, m.size)); err != nil {
		return err
	}
	delete(c.allocs, addr)
	return c.d.check("cuMemRelease", c.d.cuMemRelease(m.handle))
}

func (c *guestContext) stream(s gpu.Stream) (uintptr, error) {
	if s == 0 {
		return 0, nil
	}
	h, ok := c.streams[s]
	if !ok {
		return 0, fmt.Errorf("%w: no stream %d", abi.StatusInvalidHandle, s)
	}
	return h, nil
}

func (c *guestContext) CopyHtoD(dst uint64, src []byte, s gpu.Stream) error {
	return c.copyHtoD(dst, src, s, false)
}

// copyHtoD copies src to dst: on the null stream with cuMemcpyHtoD, which
// waits for the copy, unless queued (QueueCopyHtoD, queued.go); on a stream
// with cuMemcpyHtoDAsync, which from pageable memory returns once src has
// been staged (CUDA Runtime API, "API synchronization behavior") and from
// page-locked memory at once.
func (c *guestContext) copyHtoD(dst uint64, src []byte, s gpu.Stream, queued bool) error {
	if len(src) == 0 {
		return nil
	}
	return c.do(func() error {
		st, err := c.stream(s)
		if err != nil {
			return err
		}
		if st == 0 && !queued {
			return c.d.check("cuMemcpyHtoD", c.d.memcpyHtoD(dst, src))
		}
		c.queued = c.queued || queued
		return c.d.check("cuMemcpyHtoDAsync", c.d.memcpyHtoDAsync(dst, src, st))
	})
}

func (c *guestContext) CopyDtoH(dst []byte, src uint64, s gpu.Stream) error {
	if len(dst) == 0 {
		return nil
	}
	return c.do(func() error {
		st, err := c.stream(s)
		if err != nil {
			return err
		}
		if st != 0 {
			if err := c.d.check("cuStreamSynchronize", c.d.cuStreamSynchronize(st)); err != nil {
				return err
			}
		}
		return c.d.check("cuMemcpyDtoH", c.d.memcpyDtoH(dst, src))
	})
}

func (c *guestContext) CopyDtoD(dst, src, size uint64, s gpu.Stream) error {
	return c.do(func() error {
		st, err := c.stream(s)
		if err != nil {
			return err
		}
		if overlaps(dst, src, size) && dst != src {
			return c.moveDtoD(dst, src, size, st) // move.go
		}
		return c.d.check("cuMemcpyDtoDAsync", c.d.cuMemcpyDtoDAsync(dst, src, size, st))
	})
}

func (c *guestContext) Memset(dst uint64, width int, value uint32, count uint64, s gpu.Stream) error {
	return c.do(func() error {
		st, err := c.stream(s)
		if err != nil {
			return err
		}
		switch width {
		case 1:
			return c.d.check("cuMemsetD8Async", c.d.cuMemsetD8Async(dst, uint8(value), count, st))
		case 2:
			return c.d.check("cuMemsetD16Async", c.d.cuMemsetD16Async(dst, uint16(value), count, st))
		case 4:
			return c.d.check("cuMemsetD32Async", c.d.cuMemsetD32Async(dst, value, count, st))
		}
		return fmt.Errorf("%w: memset width %d", abi.StatusInvalidValue, width)
	})
}

func cbytes(s string) []byte { return append([]byte(s), 0) }

// loadedModule is one guest module as the driver holds it: a raw image is
// one CUDA module; a kernel list is one CUDA module per distinct PTX text
// (kernels declared with the same text share it, and so its globals).
type loadedModule struct {
	cuModules []uintptr
	byKernel  map[string]uintptr // kernel list: the CUDA module of each kernel
	raw       bool
}

func (c *guestContext) LoadModule(img *abi.ModuleImage) (gpu.Module, error) {
	var id gpu.Module
	err := c.do(func() error {
		lm := &loadedModule{byKernel: map[string]uintptr{}, raw: img.Format != abi.FormatKernels}
		if lm.raw {
			// A fresh copy: the driver wants the image aligned, a frame's
			// bytes need not be.
			m, err := c.loadImage(append(make([]byte, 0, len(img.Raw)), img.Raw...), img.Format.String())
			if err != nil {
				return err
			}
			lm.cuModules = append(lm.cuModules, m)
		}
		byText := map[string]uintptr{}
		for _, k := range img.Kernels {
			m, ok := byText[k.PTX]
			if !ok {
				var err error
				if m, err = c.loadImage(cbytes(k.PTX), "PTX of "+k.Name); err != nil {
					lm.unload(c.d)
					return err
				}
				byText[k.PTX] = m
				lm.cuModules = append(lm.cuModules, m)
			}
			lm.byKernel[k.Name] = m
		}
		c.nextID++
		id = gpu.Module(c.nextID)
		c.modules[id] = lm
		return nil
	})
	return id, err
}

// loadImage loads one image (cuModuleLoadData).
func (c *guestContext) loadImage(image []byte, what string) (uintptr, error) {
	var m uintptr
	err := c.d.check("cuModuleLoadData("+what+")", c.d.cuModuleLoadData(&m, &image[0]))
	return m, err
}

func (lm *loadedModule) unload(d *driver) {
	for _, m := range lm.cuModules {
		d.cuModuleUnload(m)
	}
}

func (c *guestContext) UnloadModule(m gpu.Module) error {
	return c.do(func() error {
		lm, ok := c.modules[m]
		if !ok {
			return fmt.Errorf("%w: no module %d", abi.StatusInvalidHandle, m)
		}
		c.d.cuCtxSynchronize()
		lm.unload(c.d)
		delete(c.modules, m)
		return nil
	})
}

// funcAttrCount is CU_FUNC_ATTRIBUTE_MAX (cuda.h, CUDA 13).
const funcAttrCount = 16

// FunctionAttrs implements gpu.FunctionDescriber (cuFuncGetAttribute of
// every attribute; zero for one this driver does not answer).
func (c *guestContext) FunctionAttrs(f gpu.Function) ([]int32, error) {
	attrs := make([]int32, funcAttrCount)
	err := c.do(func() error {
		fn, ok := c.functions[f]
		if !ok {
			return fmt.Errorf("%w: no function %d", abi.StatusInvalidHandle, f)
		}
		for a := range attrs {
			c.d.cuFuncGetAttribute(&attrs[a], int32(a), fn)
		}
		return nil
	})
	return attrs, err
}

// guestContext encodes tensor maps through the GPU's driver.
var _ gpu.TensorMapEncoder = (*guestContext)(nil)

// EncodeTensorMapTiled implements gpu.TensorMapEncoder.
func (c *guestContext) EncodeTensorMapTiled(r *abi.TensorMapEncode) (mp [abi.TensorMapBytes]byte, err error) {
	if c.d.cuTensorMapEncodeTiled == nil {
		return mp, fmt.Errorf("%w: this node's CUDA driver has no cuTensorMapEncodeTiled (CUDA 12 or later)", abi.StatusNotSupported)
	}
	err = c.do(func() error {
		mp, err = c.d.encodeTensorMapTiled(r)
		return err
	})
	return mp, err
}

// cudaErrorNotFound is CUDA_ERROR_NOT_FOUND: a module without that kernel.
const cudaErrorNotFound = 500

func (c *guestContext) Function(m gpu.Module, name string) (gpu.Function, error) {
	var id gpu.Function
	err := c.do(func() error {
		lm, ok := c.modules[m]
		if !ok {
			return fmt.Errorf("%w: no module %d", abi.StatusInvalidHandle, m)
		}
		cm, ok := lm.byKernel[name]
		if lm.raw {
			cm, ok = lm.cuModules[0], true
		}
		if !ok {
			return fmt.Errorf("%w: module %d has no kernel %q", abi.StatusInvalidValue, m, name)
		}
		var f uintptr
		cname := cbytes(name)
		if r := c.d.cuModuleGetFunction(&f, cm, &cname[0]); r == cudaErrorNotFound {
			return fmt.Errorf("%w: module %d has no kernel %q", abi.StatusInvalidValue, m, name)
		} else if err := c.d.check("cuModuleGetFunction", r); err != nil {
			return err
		}
		c.nextID++
		id = gpu.Function(c.nextID)
		c.functions[id] = f
		return nil
	})
	return id, err
}

// ParamSlots implements gpu.ParamLayouter: where each of f's parameters
// lives, as the driver knows from the loaded image (cuFuncGetParamInfo,
// CUDA 12.4 and later).
func (c *guestContext) ParamSlots(f gpu.Function) ([]abi.ParamSlot, error) {
	var slots []abi.ParamSlot
	err := c.do(func() error {
		fn, ok := c.functions[f]
		if !ok {
			return fmt.Errorf("%w: no function %d", abi.StatusInvalidHandle, f)
		}
		if c.d.cuFuncGetParamInfo == nil {
			return fmt.Errorf("%w: this NVIDIA driver lacks cuFuncGetParamInfo (CUDA 12.4 or later is needed for cubin and fatbin images)", abi.StatusNotSupported)
		}
		for i := uint64(0); ; i++ {
			var off, size uint64
			r := c.d.cuFuncGetParamInfo(fn, i, &off, &size)
			if r == 1 { // CUDA_ERROR_INVALID_VALUE: past the last parameter
				break
			}
			if err := c.d.check("cuFuncGetParamInfo", r); err != nil {
				return err
			}
			if i == abi.MaxArgs || off > abi.MaxParamBytes || size > abi.MaxParamBytes {
				return fmt.Errorf("%w: kernel parameters beyond %d or %d bytes", abi.StatusNotSupported, abi.MaxArgs, abi.MaxParamBytes)
			}
			slots = append(slots, abi.ParamSlot{Offset: uint32(off), Size: uint32(size)})
		}
		return abi.CheckSlots(slots)
	})
	return slots, err
}

func (c *guestContext) Launch(f gpu.Function, cfg gpu.LaunchConfig, args []abi.Arg, s gpu.Stream) error {
	c.mu.Lock()
	if c.launches != nil { // the launcher submits it (launcher.go)
		defer c.mu.Unlock()
		return c.queueLaunch(f, cfg, args, s)
	}
	c.mu.Unlock()
	return c.do(func() error {
		fn, st, err := c.launchTarget(f, s)
		if err != nil {
			return err
		}
		r := c.d.launchKernel(fn, cfg, st, launchParams(args, false))
		return c.d.check("cuLaunchKernel", r)
	})
}

// launchTarget is the driver's function and stream for a launch of f on s.
// Precondition: c.mu must be locked.
func (c *guestContext) launchTarget(f gpu.Function, s gpu.Stream) (fn, st uintptr, err error) {
	fn, ok := c.functions[f]
	if !ok {
		return 0, 0, fmt.Errorf("%w: no function %d", abi.StatusInvalidHandle, f)
	}
	st, err = c.stream(s)
	return fn, st, err
}

func (c *guestContext) CreateStream() (gpu.Stream, error) {
	var id gpu.Stream
	err := c.do(func() error {
		var h uintptr
		if err := c.d.check("cuStreamCreate", c.d.cuStreamCreate(&h, 0)); err != nil {
			return err
		}
		c.nextID++
		id = gpu.Stream(c.nextID)
		c.streams[id] = h
		return nil
	})
	return id, err
}

func (c *guestContext) DestroyStream(s gpu.Stream) error {
	return c.do(func() error {
		h, ok := c.streams[s]
		if !ok || s == 0 {
			return fmt.Errorf("%w: no stream %d", abi.StatusInvalidHandle, s)
		}
		delete(c.streams, s)
		return c.d.check("cuStreamDestroy", c.d.cuStreamDestroy(h))
	})
}

func (c *guestContext) SyncStream(s gpu.Stream) error {
	return c.do(func() error {
		h, err := c.stream(s)
		if err != nil {
			return err
		}
		return c.launchFailure(c.d.check("cuStreamSynchronize", c.d.cuStreamSynchronize(h)))
	})
}

func (c *guestContext) Sync() error {
	return c.do(func() error { return c.launchFailure(c.d.check("cuCtxSynchronize", c.d.cuCtxSynchronize())) })
}

// launchFailure is err, or else a queued launch's submission error not
// yet returned (launcher.go).
// Precondition: c.mu must be locked.
func (c *guestContext) launchFailure(err error) error {
	if c.launches == nil || err != nil {
		return err
	}
	return c.launches.takeFailure()
}

func (c *guestContext) Close() error {
	err := c.do(func() error {
		d := c.d
		if c.launches != nil {
			c.launches.close()
			c.launches = nil
		}
		if c.snap != nil {
			c.snap.releaseLocked() // after any read under way
		}
		d.cuCtxSynchronize()
		c.dropMarks() // queued.go
		for s, h := range c.streams {
			d.cuStreamDestroy(h)
			delete(c.streams, s)
		}
		for m, lm := range c.modules {
			lm.unload(d)
			delete(c.modules, m)
		}
		for addr := range c.allocs {
			c.free(addr)
		}
		if c.moveBuf != 0 {
			d.cuMemFree(c.moveBuf)
		}
		if c.sumOut != 0 {
			d.cuMemFree(c.sumOut)
			d.cuModuleUnload(c.sumMod)
		}
		d.cuMemAddressFree(c.base, c.reserved())
		return d.check("cuCtxDestroy", d.cuCtxDestroy(c.ctx))
	})
	return err
}

// PinnedCopy returns a function that copies n bytes from page-locked host
// memory (cuMemAllocHost) to dst with cuMemcpyHtoD in ctx: the fastest plain
// host-to-device path, which benchmarks compare the replica's apply with.
// ctx must come from this backend; release frees the host buffer.
func (b *Backend) PinnedCopy(ctx gpu.Context, dst uint64, n int) (copyFn func() error, release func(), err error) {
	c, ok := ctx.(*guestContext)
	if !ok {
		return nil, nil, fmt.Errorf("cuda: PinnedCopy needs a context of this backend")
	}
	var host []byte
	if err := c.do(func() error {
		var r result
		host, r = c.d.memAllocHost(n)
		return c.d.check("cuMemAllocHost", r)
	}); err != nil {
		return nil, nil, err
	}
	copyFn = func() error {
		return c.do(func() error { return c.d.check("cuMemcpyHtoD", c.d.memcpyHtoD(dst, host)) })
	}
	release = func() { c.do(func() error { return c.d.check("cuMemFreeHost", c.d.memFreeHost(host)) }) }
	return copyFn, release, nil
}

// AllocHost implements gpu.HostAllocator: n bytes of page-locked host
// memory usable by every context (CU_MEMHOSTALLOC_PORTABLE), from which
// cuMemcpyHtoD runs at full DMA speed. The memory is never freed.
func (b *Backend) AllocHost(n int) ([]byte, error) {
	var mem []byte
	err := b.onHostCtx(func() error {
		var r result
		mem, r = b.d.memHostAlloc(n, 1)
		return b.d.check("cuMemHostAlloc", r)
	})
	if err != nil {
		return nil, err
	}
	return mem, nil
}

// RegisterHost implements gpu.HostRegistrar: it page-locks mem for every
// context (cuMemHostRegister with CU_MEMHOSTREGISTER_PORTABLE, CUDA Driver
// API "Memory Management"), so copies from it run at DMA rate. The driver
// requires page-aligned memory of a page multiple for best results; a
// shared-memory area is both.
func (b *Backend) RegisterHost(mem []byte) (func() error, error) {
	if len(mem) == 0 {
		return func() error { return nil }, nil
	}
	if err := b.onHostCtx(func() error {
		return b.d.check("cuMemHostRegister", b.d.memHostRegister(mem, 1))
	}); err != nil {
		return nil, err
	}
	return func() error {
		return b.onHostCtx(func() error {
			return b.d.check("cuMemHostUnregister", b.d.memHostUnregister(mem))
		})
	}, nil
}

// onHostCtx runs f on a locked thread with the backend's host-memory
// context current (created on first use).
func (b *Backend) onHostCtx(f func() error) error {
	b.hostMu.Lock()
	defer b.hostMu.Unlock()
	return onThread(func() error {
		if b.hostCtx == 0 {
			if err := b.d.check("cuCtxCreate", b.d.cuCtxCreate(&b.hostCtx, 0, b.dev)); err != nil {
				return err
			}
		}
		if err := b.d.check("cuCtxSetCurrent", b.d.cuCtxSetCurrent(b.hostCtx)); err != nil {
			return err
		}
		return f()
	})
}

var (
	_ gpu.HostAllocator = (*Backend)(nil)
	_ gpu.HostRegistrar = (*Backend)(nil)
	_ gpu.QueuedCopier  = (*guestContext)(nil)
)
