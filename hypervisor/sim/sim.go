// Package sim is a software GPU: a gpu.Backend whose device memory is host
// RAM and whose kernels are the Go implementations in kernels. It
// lets every other part of vgpuha run, and be tested, on machines without a
// GPU.
//
// Work is executed when it is submitted, so every stream trivially runs in
// order and Sync has nothing to wait for. The backend refuses a kernel whose
// declaration in the module image differs from the library's (it would run
// the wrong code), and faults a launch that touches memory outside its own
// context, as a GPU raises an illegal-address error.
//
// It takes memory snapshots for a resync (gpu.Snapshotter) by copy-on-write
// in software (snapshot.go): every write to device memory, a kernel's
// included, must go through a writable view, never through View.
package sim

import (
	"fmt"
	"sort"
	"sync"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/kernels"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Backend is the software GPU. Its memory limit is shared by all contexts,
// like a real device's.
type Backend struct {
	// BaseShift moves every context's window this far from the base asked
	// for, as a real GPU may when the address is taken. Tests use it to
	// force a standby into address translation.
	BaseShift uint64
	// Number tells apart the software GPUs of one node (--sim.gpus): it
	// is the last byte of the UUID the GPU describes itself by (0: the
	// one UUID a single software GPU always had).
	Number uint8

	mu    sync.Mutex
	limit uint64
	used  uint64

	prefaultOnce sync.Once
	prefault     chan []byte // pieces of memory to populate (prefault.go)
}

// New returns a software GPU with memLimit bytes of device memory.
func New(memLimit uint64) *Backend { return &Backend{limit: memLimit} }

// Name implements gpu.Backend.
func (b *Backend) Name() string { return "sim" }

// ChecksEveryAccess implements gpu.AccessChecker: every kernel reads and
// writes through its context's View, which checks the allocation.
func (b *Backend) ChecksEveryAccess() bool { return true }

// Close implements gpu.Backend.
func (b *Backend) Close() error { return nil }

// Used reports the device memory held by all contexts.
func (b *Backend) Used() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

func (b *Backend) reserve(n uint64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n > b.limit-b.used {
		return fmt.Errorf("%w: device has %d of %d bytes free, asked for %d", abi.StatusOutOfMemory, b.limit-b.used, b.limit, n)
	}
	b.used += n
	return nil
}

func (b *Backend) release(n uint64) {
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
}

// NewContext implements gpu.Backend. The software GPU gets the base it asks
// for, moved by BaseShift.
func (b *Backend) NewContext(base, size uint64) (gpu.Context, error) {
	base += b.BaseShift
	if size == 0 || base+size < base {
		return nil, fmt.Errorf("%w: window [%#x, +%#x) wraps or is empty", abi.StatusInvalidValue, base, size)
	}
	return &guestContext{
		be: b, base: base, size: size,
		modules:   map[gpu.Module]*abi.ModuleImage{},
		functions: map[gpu.Function]*kernels.Kernel{},
		streams:   map[gpu.Stream]bool{},
	}, nil
}

type allocation struct {
	addr uint64
	data []byte
	cow  *cowAlloc // the live memory snapshot's view of it, if any (snapshot.go)
}

// guestContext is one guest session's gpu.Context on the software GPU: its
// address window, its allocations (host memory) and its handle tables.
type guestContext struct {
	be         *Backend
	base, size uint64

	mu        sync.Mutex
	allocs    []allocation // sorted by addr, never overlapping
	modules   map[gpu.Module]*abi.ModuleImage
	functions map[gpu.Function]*kernels.Kernel
	fnModule  map[gpu.Function]gpu.Module
	streams   map[gpu.Stream]bool
	nextID    uint64
	snap      *memSnapshot // the live memory snapshot, if any
}

func (c *guestContext) Window() (uint64, uint64) { return c.base, c.size }

// find returns the index of the allocation containing addr, or -1.
// Precondition: c.mu must be locked.
func (c *guestContext) find(addr uint64) int {
	i := sort.Search(len(c.allocs), func(i int) bool { return c.allocs[i].addr > addr }) - 1
	if i < 0 || addr-c.allocs[i].addr >= uint64(len(c.allocs[i].data)) {
		return -1
	}
	return i
}

// View returns the n bytes at addr, which must lie inside one allocation,
// for reading only.
// Precondition: c.mu must be locked.
func (c *guestContext) View(addr, n uint64) ([]byte, error) {
	i, off, err := c.span(addr, n)
	if err != nil {
		return nil, err
	}
	return c.allocs[i].data[off : off+n : off+n], nil
}

// writable is View for a caller that may write through the slice: a live
// memory snapshot first keeps the bytes it still needs (copy-on-write).
// Precondition: c.mu must be locked.
func (c *guestContext) writable(addr, n uint64) ([]byte, error) {
	i, off, err := c.span(addr, n)
	if err != nil {
		return nil, err
	}
	a := &c.allocs[i]
	if a.cow != nil {
		a.cow.keep(off, n)
	}
	return a.data[off : off+n : off+n], nil
}

// span finds the allocation holding [addr, addr+n) and addr's offset in it.
// Precondition: c.mu must be locked.
func (c *guestContext) span(addr, n uint64) (int, uint64, error) {
	i := c.find(addr)
	if i < 0 {
		return 0, 0, fmt.Errorf("%w: %#x is not inside any allocation", abi.StatusOutOfRange, addr)
	}
	a := c.allocs[i]
	off := addr - a.addr
	if n > uint64(len(a.data))-off {
		return 0, 0, fmt.Errorf("%w: %d bytes at %#x overrun the %d-byte allocation at %#x",
			abi.StatusOutOfRange, n, addr, len(a.data), a.addr)
	}
	return i, off, nil
}

func (c *guestContext) Alloc(addr, size uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if size == 0 || addr < c.base || size > c.size || addr-c.base > c.size-size {
		return fmt.Errorf("%w: allocation [%#x, +%d) is outside the window", abi.StatusOutOfRange, addr, size)
	}
	i := sort.Search(len(c.allocs), func(i int) bool { return c.allocs[i].addr >= addr })
	if i > 0 {
		prev := c.allocs[i-1]
		if prev.addr+uint64(len(prev.data)) > addr {
			return fmt.Errorf("%w: allocation at %#x overlaps one at %#x", abi.StatusInvalidValue, addr, prev.addr)
		}
	}
	if i < len(c.allocs) && c.allocs[i].addr < addr+size {
		return fmt.Errorf("%w: allocation at %#x overlaps one at %#x", abi.StatusInvalidValue, addr, c.allocs[i].addr)
	}
	if err := c.be.reserve(size); err != nil {
		return err
	}
	c.allocs = append(c.allocs, allocation{})
	copy(c.allocs[i+1:], c.allocs[i:])
	c.allocs[i] = allocation{addr: addr, data: deviceMemory(size)}
	return nil
}

func (c *guestContext) Free(addr uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := c.find(addr)
	if i < 0 || c.allocs[i].addr != addr {
		return fmt.Errorf("%w: no allocation starts at %#x", abi.StatusInvalidValue, addr)
	}
	c.be.release(uint64(len(c.allocs[i].data)))
	// A snapshot keeps the freed memory as it is: nothing writes it now.
	c.allocs = append(c.allocs[:i], c.allocs[i+1:]...)
	return nil
}

// Precondition: c.mu must be locked.
func (c *guestContext) checkStream(s gpu.Stream) error {
	if s != 0 && !c.streams[s] {
		return fmt.Errorf("%w: no stream %d", abi.StatusInvalidHandle, s)
	}
	return nil
}

func (c *guestContext) CopyHtoD(dst uint64, src []byte, s gpu.Stream) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.checkStream(s); err != nil {
		return err
	}
	to, err := c.pieces(dst, uint64(len(src)), true)
	if err != nil {
		return err
	}
	for _, d := range to {
		src = src[copy(d, src):]
	}
	return nil
}

func (c *guestContext) CopyDtoH(dst []byte, src uint64, s gpu.Stream) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.checkStream(s); err != nil {
		return err
	}
	from, err := c.pieces(src, uint64(len(dst)), false)
	if err != nil {
		return err
	}
	for _, v := range from {
		dst = dst[copy(dst, v):]
	}
	return nil
}

func (c *guestContext) CopyDtoD(dst, src, size uint64, s gpu.Stream) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.checkStream(s); err != nil {
		return err
	}
	from, err := c.pieces(src, size, false)
	if err != nil {
		return err
	}
	to, err := c.pieces(dst, size, true)
	if err != nil {
		return err
	}
	if len(from) == 1 && len(to) == 1 {
		copy(to[0], from[0]) // overlapping ranges too, as memmove
		return nil
	}
	buf := make([]byte, 0, size) // across allocations: read all, then write
	for _, v := range from {
		buf = append(buf, v...)
	}
	for _, d := range to {
		buf = buf[copy(d, buf):]
	}
	return nil
}

func (c *guestContext) Memset(dst uint64, width int, value uint32, count uint64, s gpu.Stream) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.checkStream(s); err != nil {
		return err
	}
	if width != 1 && width != 2 && width != 4 {
		return fmt.Errorf("%w: memset width %d (want 1, 2 or 4)", abi.StatusInvalidValue, width)
	}
	if count > (1<<63)/uint64(width) {
		return fmt.Errorf("%w: memset of %d elements", abi.StatusInvalidValue, count)
	}
	to, err := c.pieces(dst, count*uint64(width), true)
	if err != nil {
		return err
	}
	pattern := [4]byte{byte(value), byte(value >> 8), byte(value >> 16), byte(value >> 24)}
	at := 0 // bytes filled before this piece: where in the pattern it starts
	for _, d := range to {
		fill(d, pattern[:width], at)
		at += len(d)
	}
	return nil
}

// fill writes pattern over d, repeated, d's first byte being byte at of
// the repetition.
func fill(d, pattern []byte, at int) {
	w := len(pattern)
	if w == 1 {
		for i := range d {
			d[i] = pattern[0]
		}
		return
	}
	i := 0
	for ; i < len(d) && (at+i)%w != 0; i++ {
		d[i] = pattern[(at+i)%w]
	}
	for ; i+w <= len(d); i += w {
		copy(d[i:i+w], pattern)
	}
	for ; i < len(d); i++ {
		d[i] = pattern[(at+i)%w]
	}
}

// pieces is [addr, addr+n) as the allocations that hold it, in order: a
// copy may run from one allocation into the next when it starts where
// the other ends, as a GPU's mappings that follow one another are one
// range (CUDA's virtual memory management). For a writer (write), a live
// memory snapshot first keeps the bytes it still needs (copy-on-write).
// Precondition: c.mu must be locked.
func (c *guestContext) pieces(addr, n uint64, write bool) ([][]byte, error) {
	var out [][]byte
	for {
		i, off, err := c.span(addr, 0)
		if err != nil {
			return nil, err
		}
		a := &c.allocs[i]
		k := min(n, uint64(len(a.data))-off)
		if write && a.cow != nil {
			a.cow.keep(off, k)
		}
		out = append(out, a.data[off:off+k:off+k])
		if n -= k; n == 0 {
			return out, nil
		}
		addr += k
	}
}

func (c *guestContext) newID() uint64 { c.nextID++; return c.nextID }

func (c *guestContext) LoadModule(img *abi.ModuleImage) (gpu.Module, error) {
	if img.Format == abi.FormatFatbin {
		var err error
		if img, err = fatbinKernels(img.Raw); err != nil {
			return 0, err
		}
	}
	if img.Format != abi.FormatKernels {
		return 0, fmt.Errorf("%w: the software GPU runs only the kernel library's kernels (as PTX, %v); a %v image needs --backend cuda",
			abi.StatusNotSupported, kernels.Names(), img.Format)
	}
	for _, spec := range img.Kernels {
		k, ok := kernels.Lookup(spec.Name)
		if !ok {
			return 0, fmt.Errorf("%w: the software GPU has no implementation of kernel %q (it runs only %v)",
				abi.StatusNotSupported, spec.Name, kernels.Names())
		}
		if !k.Matches(spec) {
			return 0, fmt.Errorf("%w: kernel %q differs from the library's (signature or PTX); the software GPU runs only library kernels",
				abi.StatusNotSupported, spec.Name)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	m := gpu.Module(c.newID())
	c.modules[m] = img
	return m, nil
}

func (c *guestContext) UnloadModule(m gpu.Module) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.modules[m] == nil {
		return fmt.Errorf("%w: no module %d", abi.StatusInvalidHandle, m)
	}
	delete(c.modules, m)
	for f, owner := range c.fnModule {
		if owner == m {
			delete(c.functions, f)
			delete(c.fnModule, f)
		}
	}
	return nil
}

func (c *guestContext) Function(m gpu.Module, name string) (gpu.Function, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	img := c.modules[m]
	if img == nil {
		return 0, fmt.Errorf("%w: no module %d", abi.StatusInvalidHandle, m)
	}
	if _, ok := img.Kernel(name); !ok {
		return 0, fmt.Errorf("%w: module has no kernel %q", abi.StatusInvalidValue, name)
	}
	k, _ := kernels.Lookup(name)
	f := gpu.Function(c.newID())
	c.functions[f] = k
	if c.fnModule == nil {
		c.fnModule = map[gpu.Function]gpu.Module{}
	}
	c.fnModule[f] = m
	return f, nil
}

func (c *guestContext) Launch(f gpu.Function, cfg gpu.LaunchConfig, args []abi.Arg, s gpu.Stream) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.checkStream(s); err != nil {
		return err
	}
	k := c.functions[f]
	if k == nil {
		return fmt.Errorf("%w: no function %d", abi.StatusInvalidHandle, f)
	}
	if cfg.Cooperative && cfg.Grid.Count() > maxCoResidentBlocks {
		return fmt.Errorf("%w: %d blocks, at most %d resident at once", abi.StatusCooperativeTooLarge, cfg.Grid.Count(), maxCoResidentBlocks)
	}
	args, err := typedArgs(k, args)
	if err != nil {
		return err
	}
	if err := k.Run(memory{c}, kernels.Launch{Grid: cfg.Grid, Block: cfg.Block, SharedBytes: cfg.SharedBytes, Args: args}); err != nil {
		return fmt.Errorf("%w: %s: %w", abi.StatusLaunchFailed, k.Name, err)
	}
	return nil
}

// memory adapts a locked context to kernels.Memory. A kernel may write
// anything it views (through pointers it read from memory, too), so every
// view is writable: a memory snapshot keeps what it covers.
type memory struct{ c *guestContext }

func (m memory) View(addr, n uint64) ([]byte, error) { return m.c.writable(addr, n) }

func (c *guestContext) CreateStream() (gpu.Stream, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := gpu.Stream(c.newID())
	c.streams[s] = true
	return s, nil
}

func (c *guestContext) DestroyStream(s gpu.Stream) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s == 0 || !c.streams[s] {
		return fmt.Errorf("%w: no stream %d", abi.StatusInvalidHandle, s)
	}
	delete(c.streams, s)
	return nil
}

func (c *guestContext) SyncStream(s gpu.Stream) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.checkStream(s)
}

func (c *guestContext) Sync() error { return nil }

func (c *guestContext) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, a := range c.allocs {
		c.be.release(uint64(len(a.data)))
	}
	c.allocs = nil
	c.modules = map[gpu.Module]*abi.ModuleImage{}
	c.functions = map[gpu.Function]*kernels.Kernel{}
	c.streams = map[gpu.Stream]bool{}
	return nil
}

// Checksum implements gpu.Checksummer in place, without a copy.
func (c *guestContext) Checksum(addr, n uint64) (uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, err := c.View(addr, n)
	if err != nil {
		return 0, err
	}
	return gpu.Checksum(b), nil
}
