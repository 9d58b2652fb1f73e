package cuapi

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"

	"github.com/vgpuha/vgpuha/kernels"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Modules. A PTX image is sent as a module image declaring each of its
// entries with the parameter kinds its PTX gives them; an entry whose
// PTX is exactly a library kernel's is declared as the library declares
// it (pointer parameters as pointers), so the hypervisor checks its
// arguments and the software GPU runs it. The software GPU refuses any
// other kernel, naming it. A cubin or fatbin is sent whole (a raw image):
// only the primary's GPU driver can read it, so the primary reports each
// function's parameter slots and launches pass every parameter as bytes.

type module struct {
	ctx     uint64
	remote  pvdriver.Module
	raw     bool          // a cubin or fatbin: no entries, the primary knows its kernels
	image   []byte        // a raw image's bytes
	hash    abi.ImageHash // the image's hash as sent (modcache.go)
	shared  *sharedModule // the node module this handle shares with others of its image (modcache.go)
	entries map[string]abi.PTXEntry
	kinds   map[string][]abi.ArgKind
	globals map[string]bool
	ptxVer  int
	funcs   map[string]uint64 // functions taken from it, by name

	// lazy is a library's image (cuLibraryLoadData) not yet loaded on
	// the primary: it is loaded at the first kernel or global taken from
	// it, as CUDA's lazy loading does, so the hundreds of images a
	// framework registers at start cost nothing until used, and an image
	// with no code for this GPU fails only if a kernel of it is asked for.
	lazy    []byte
	lazyErr Result // the lazy load's failure, answered to every later use
}

type function struct {
	module  uint64
	name    string
	remote  pvdriver.Function
	offs    []int   // each parameter's offset in a packed buffer
	sizes   []int   // and its size
	total   int     // the packed buffer's size
	attrs   []int32 // CUfunction_attribute values the primary's GPU gave, if it did
	kinds   []abi.ArgKind
	ptxVer  int
	maxDyn  int32 // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
	carveup int32 // CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
	// nonPortable and policy are the cluster attributes the program set
	// (CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
	// CLUSTER_SCHEDULING_POLICY_PREFERENCE); occupancy keeps the node's
	// answers (occupancy.go).
	nonPortable bool
	policy      int32
	occupancy   map[occupancyKey]int32
	// raw: taken from a cubin or fatbin, whose parameter layout the node
	// reports; described: attrs (and a raw function's layout) are known.
	raw, described bool
}

// Image magics (cuda.h / fatbinary_section.h).
const (
	fatbinMagic        = 0xBA55ED50 // a fatbin container's header
	FatbinWrapperMagic = 0x466243B1 // __fatBinC_Wrapper_t, around a fatbin
)

// ImageSize is how many bytes of an image of unknown length (cuModuleLoadData
// takes only a pointer) belong to it, from the first bytes: head holds at
// least 64 bytes of the image or all of it. PTX ends at its NUL, which the
// caller finds itself (ok false, ptx true). The size is what the headers
// say, however large (the caller refuses one over abi.MaxImage, saying
// so); ok is false only for headers no image has (a size that overflows).
func ImageSize(head []byte) (n uint64, ptx, ok bool) {
	switch {
	case len(head) >= 16 && binary.LittleEndian.Uint32(head) == fatbinMagic:
		hdr := uint64(binary.LittleEndian.Uint16(head[6:]))
		body := binary.LittleEndian.Uint64(head[8:])
		if body > math.MaxUint64-hdr {
			return 0, false, false
		}
		return hdr + body, false, true
	case len(head) >= 64 && bytes.HasPrefix(head, []byte(elf.ELFMAG)) && head[elf.EI_CLASS] == byte(elf.ELFCLASS64):
		shoff := binary.LittleEndian.Uint64(head[0x28:])
		shentsize := uint64(binary.LittleEndian.Uint16(head[0x3a:]))
		shnum := uint64(binary.LittleEndian.Uint16(head[0x3c:]))
		if table := shentsize * shnum; shoff <= math.MaxUint64-table { // both below 2^16: no overflow
			return shoff + table, false, true // cubins end with their section headers
		}
		return 0, false, false
	}
	return 0, true, false
}

// RefuseImageSize says on stderr why an image of n bytes is refused
// (CUDA_ERROR_INVALID_IMAGE): it is larger than the library loads.
func RefuseImageSize(n uint64) {
	fmt.Fprintf(os.Stderr, "vgpuha libcuda: a module image of %d bytes is refused: the library loads images of at most %d bytes (CUDA_ERROR_INVALID_IMAGE)\n",
		n, abi.MaxImage)
}

// IsBinaryImage reports whether an image's first four bytes start a
// fatbin or an ELF file (a cubin) rather than PTX text.
func IsBinaryImage(head []byte) bool {
	return len(head) >= 4 && (binary.LittleEndian.Uint32(head) == fatbinMagic || bytes.HasPrefix(head, []byte(elf.ELFMAG)))
}

// CubinEnd is where a cubin's last byte lies, from its section and program
// headers (b must hold the section header table); ok is false when they
// do not lie inside b.
func CubinEnd(b []byte) (end uint64, ok bool) {
	if len(b) < 64 {
		return 0, false
	}
	le := binary.LittleEndian
	table := func(off, entsize, n uint64) bool {
		if entsize > 4096 || off > abi.MaxImage || n*entsize > abi.MaxImage {
			return false
		}
		end = max(end, off+n*entsize)
		return true
	}
	shoff, shentsize, shnum := le.Uint64(b[0x28:]), uint64(le.Uint16(b[0x3a:])), uint64(le.Uint16(b[0x3c:]))
	if !table(le.Uint64(b[0x20:]), uint64(le.Uint16(b[0x36:])), uint64(le.Uint16(b[0x38:]))) ||
		!table(shoff, shentsize, shnum) || end > uint64(len(b)) || shentsize < 40 {
		return 0, false
	}
	for i := range shnum {
		sh := b[shoff+i*shentsize:]
		if typ, off, size := le.Uint32(sh[4:]), le.Uint64(sh[24:]), le.Uint64(sh[32:]); typ != 8 { // SHT_NOBITS has no bytes
			if off > abi.MaxImage || size > abi.MaxImage {
				return 0, false
			}
			end = max(end, off+size)
		}
	}
	return end, true
}

// ModuleLoadFile is cuModuleLoad.
func (d *Driver) ModuleLoadFile(t Thread, path string) (uint64, Result) {
	if r := d.requireCurrent(t); r != Success {
		return 0, r
	}
	img, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "vgpuha libcuda: cuModuleLoad: %v\n", err)
		return 0, ErrorFileNotFound
	}
	return d.ModuleLoadData(t, img)
}

func (d *Driver) requireCurrent(t Thread) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, r := d.current(t)
	return r
}

// ModuleLoadData is cuModuleLoadData, cuModuleLoadDataEx (JIT options do
// not apply) and cuModuleLoadFatBinary.
func (d *Driver) ModuleLoadData(t Thread, img []byte) (uint64, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ctx, r := d.current(t)
	if r != Success {
		return 0, r
	}
	m, r := d.loadImage(ctx, img, true)
	if r != Success {
		return 0, r
	}
	h := d.mint()
	d.modules[h] = m
	return h, Success
}

// loadImage loads img on the primary as a module of ctx; loud says a
// refusal on stderr (a library's lazy load fails quietly, as CUDA's does:
// frameworks register images for GPUs other than this one and never use
// them).
// Precondition: d.mu must be locked.
func (d *Driver) loadImage(ctx uint64, img []byte, loud bool) (*module, Result) {
	if !abi.IsPTX(img) {
		return d.loadRaw(ctx, img, loud)
	}
	text := strings.TrimSuffix(string(img), "\x00")
	entries, err := abi.ParsePTX(text)
	if err != nil {
		fmt.Fprintf(os.Stderr, "vgpuha libcuda: cuModuleLoadData: %v\n", err)
		return nil, ErrorInvalidPTX
	}
	m := &module{ctx: ctx, entries: map[string]abi.PTXEntry{}, kinds: map[string][]abi.ArgKind{},
		globals: ptxGlobals(text), ptxVer: abi.PTXVersion(text), funcs: map[string]uint64{}}
	var image abi.ModuleImage
	for _, e := range entries {
		spec := abi.KernelSpec{Name: e.Name, PTX: text}
		if k, ok := kernels.Lookup(e.Name); ok && k.PTX == text && len(k.Params) == len(e.Params) {
			spec.Params = k.Params
		} else {
			for _, p := range e.Params {
				spec.Params = append(spec.Params, p.Kind())
			}
		}
		m.entries[e.Name], m.kinds[e.Name] = e, spec.Params
		image.Kernels = append(image.Kernels, spec)
	}
	encoded := image.Append(nil)
	if len(encoded) > abi.MaxImage {
		fmt.Fprintf(os.Stderr, "vgpuha libcuda: cuModuleLoadData: a PTX module of %d bytes is refused: the library loads images of at most %d bytes (CUDA_ERROR_INVALID_IMAGE)\n",
			len(encoded), abi.MaxImage)
		return nil, ErrorInvalidImage
	}
	m.hash = abi.HashImage(encoded)
	if shareable(m) {
		if sm := d.takeShared(ctx, m.hash); sm != nil {
			m.remote, m.shared = sm.remote, sm
			return m, Success
		}
	}
	if m.remote, err = d.client.LoadModule(encoded); err != nil {
		return nil, resultOf("cuModuleLoadData", err, loud)
	}
	d.share(m)
	return m, Success
}

// loadRaw sends a cubin or fatbin whole.
// Precondition: d.mu must be locked.
func (d *Driver) loadRaw(ctx uint64, img []byte, loud bool) (*module, Result) {
	n, ok := rawSize(img)
	if !ok {
		return nil, ErrorInvalidImage
	}
	format := abi.FormatCubin
	if binary.LittleEndian.Uint32(img) == fatbinMagic {
		format = abi.FormatFatbin
	} else if end, ok := CubinEnd(img); ok && end <= uint64(len(img)) {
		n = end
	}
	wire, err := abi.RawImage(format, img[:n])
	if err != nil {
		fmt.Fprintf(os.Stderr, "vgpuha libcuda: cuModuleLoadData: %v\n", err)
		return nil, ErrorInvalidImage
	}
	h := abi.HashImage(wire)
	if d.noBinary[h] {
		return nil, ErrorNoBinaryForGPU
	}
	if sm := d.takeShared(ctx, h); sm != nil {
		return &module{ctx: ctx, remote: sm.remote, raw: true, image: img[:n], hash: h, shared: sm, funcs: map[string]uint64{}}, Success
	}
	remote, err := d.client.LoadModuleHashed(wire, h)
	if errors.Is(err, abi.StatusNoBinaryForGPU) {
		// A caller offered an image for other GPUs and tries the next one,
		// as with NVIDIA's driver: quiet, and answered here next time.
		if d.noBinary == nil {
			d.noBinary = map[abi.ImageHash]bool{}
		}
		d.noBinary[h] = true
		return nil, resultOf("cuModuleLoadData", err, false)
	}
	if err != nil {
		return nil, resultOf("cuModuleLoadData", err, loud)
	}
	m := &module{ctx: ctx, remote: remote, raw: true, image: img[:n], hash: h, funcs: map[string]uint64{}}
	d.share(m)
	return m, Success
}

// rawSize is how many bytes of img a cubin or fatbin holds, checked.
func rawSize(img []byte) (uint64, bool) {
	n, _, ok := ImageSize(img)
	if ok && n > abi.MaxImage {
		RefuseImageSize(n)
		return 0, false
	}
	if !ok || n > uint64(len(img)) {
		fmt.Fprintf(os.Stderr, "vgpuha libcuda: cuModuleLoadData: %d bytes that are neither PTX nor a whole cubin or fatbin\n", len(img))
		return 0, false
	}
	return n, true
}

// LoadLibrary is cuLibraryLoadData's part in ctx: the image is checked
// now and loaded on the primary when first used (module.lazy).
func (d *Driver) LoadLibrary(ctx uint64, img []byte) (uint64, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.context(ctx, false); r != Success {
		return 0, r
	}
	if !abi.IsPTX(img) {
		if _, ok := rawSize(img); !ok {
			return 0, ErrorInvalidImage
		}
	}
	h := d.mint()
	d.modules[h] = &module{ctx: ctx, lazy: img, funcs: map[string]uint64{}}
	return h, Success
}

// loaded makes sure m is loaded on the primary: a library's first use
// loads it.
// Precondition: d.mu must be locked.
func (d *Driver) loaded(m *module) Result {
	if m.lazy == nil {
		return m.lazyErr
	}
	got, r := d.loadImage(m.ctx, m.lazy, false)
	if r != Success {
		m.lazy, m.lazyErr = nil, r
		return r
	}
	got.funcs = m.funcs
	*m = *got
	return Success
}

// ptxGlobals lists the module-scope .global and .const variables of PTX.
func ptxGlobals(text string) map[string]bool {
	g := map[string]bool{}
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(strings.TrimSuffix(strings.TrimSpace(line), ";"))
		if len(f) < 2 || !(contains(f, ".global") || contains(f, ".const")) || contains(f, ".entry") || contains(f, ".func") {
			continue
		}
		name, _, _ := strings.Cut(f[len(f)-1], "[")
		name, _, _ = strings.Cut(name, "=")
		g[name] = true
	}
	return g
}

func contains(f []string, s string) bool {
	for _, x := range f {
		if x == s {
			return true
		}
	}
	return false
}

// ModuleUnload is cuModuleUnload.
func (d *Driver) ModuleUnload(t Thread, h uint64) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.ready(); r != Success {
		return r
	}
	m := d.modules[h]
	if m == nil {
		return ErrorInvalidHandle
	}
	return resultOf("cuModuleUnload", d.unloadModule(h, m), false)
}

// unloadModule forgets m and its functions and unloads its node module,
// unless other handles share it or it is parked (modcache.go).
// Precondition: d.mu must be locked.
func (d *Driver) unloadModule(h uint64, m *module) error {
	for _, f := range m.funcs {
		delete(d.funcs, f)
	}
	d.changed()
	delete(d.modules, h)
	d.forgetGlobals(h)
	if m.lazy != nil || m.lazyErr != Success {
		return nil // never loaded on the primary
	}
	if m.shared == nil {
		return d.client.UnloadModule(m.remote)
	}
	unload, evicted := d.release(m.shared)
	if evicted != nil {
		d.client.UnloadModule(evicted.remote)
	}
	if unload {
		return d.client.UnloadModule(m.remote)
	}
	return nil
}

// ModuleGetFunction is cuModuleGetFunction: the same handle for the same
// name, CUDA_ERROR_NOT_FOUND for a name the module lacks.
func (d *Driver) ModuleGetFunction(h uint64, name string) (uint64, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.ready(); r != Success {
		return 0, r
	}
	m := d.modules[h]
	if m == nil {
		return 0, ErrorInvalidHandle
	}
	if f, ok := m.funcs[name]; ok {
		return f, Success
	}
	if len(name) > abi.MaxKernelName {
		return 0, ErrorNotFound
	}
	if r := d.loaded(m); r != Success {
		return 0, r
	}
	if fn := sharedFunction(m, h, name); fn != nil { // another handle of the image looked it up
		return d.keepFunction(m, fn), Success
	}
	if m.raw {
		return d.rawFunction(h, m, name)
	}
	e, ok := m.entries[name]
	if !ok {
		return 0, ErrorNotFound
	}
	remote, err := d.client.GetFunction(m.remote, name)
	if err != nil {
		return 0, resultOf("cuModuleGetFunction", err, false)
	}
	fn := &function{module: h, name: name, remote: remote, kinds: m.kinds[name], ptxVer: m.ptxVer, maxDyn: d.attr(8), carveup: -1}
	fn.offs, fn.total = e.Offsets()
	for _, p := range e.Params {
		fn.sizes = append(fn.sizes, p.Size)
	}
	return d.keepFunction(m, fn), Success
}

// rawFunction takes a function from a raw image: the primary says
// whether the image has it and where its parameters go.
// Precondition: d.mu must be locked.
func (d *Driver) rawFunction(h uint64, m *module, name string) (uint64, Result) {
	remote, err := d.client.GetFunction(m.remote, name)
	if errors.Is(err, abi.StatusInvalidValue) {
		return 0, ErrorNotFound
	}
	if err != nil {
		return 0, resultOf("cuModuleGetFunction", err, false)
	}
	fn := &function{module: h, name: name, remote: remote, raw: true, maxDyn: d.attr(8), carveup: -1}
	return d.keepFunction(m, fn), Success
}

// describe asks the node, the first time it is needed (a launch, an
// attribute, the parameters), for fn's attributes and a raw function's
// parameter layout. Most functions a library looks up are never launched
// (cuDNN looks up thousands as it starts), so a lookup costs one round
// trip instead of two. An error surfaces at that first use.
// Precondition: d.mu must be locked.
func (d *Driver) describe(fn *function) Result {
	if fn.described {
		return Success
	}
	slots, attrs, err := d.client.FunctionParams(fn.remote)
	if err != nil {
		return resultOf("cuModuleGetFunction", err, true)
	}
	fn.attrs = attrs
	if fn.raw {
		for _, s := range slots {
			fn.offs, fn.sizes, fn.kinds = append(fn.offs, int(s.Offset)), append(fn.sizes, int(s.Size)), append(fn.kinds, abi.ArgBytes)
			fn.total = int(s.Offset + s.Size)
		}
	}
	fn.described = true
	return Success
}

// keepFunction mints a handle for fn, taken from m.
// Precondition: d.mu must be locked.
func (d *Driver) keepFunction(m *module, fn *function) uint64 {
	f := d.mint()
	d.funcs[f] = fn
	m.funcs[fn.name] = f
	if m.shared != nil && m.shared.fns[fn.name] == nil {
		m.shared.fns[fn.name] = fn
	}
	return f
}

// ModuleGetGlobal is cuModuleGetGlobal_v2: the address the node's GPU
// gave the module's variable, and its size (globals.go says how copies
// reach it); CUDA_ERROR_NOT_FOUND for a name the module does not have.
func (d *Driver) ModuleGetGlobal(h uint64, name string) (uint64, uint64, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.ready(); r != Success {
		return 0, 0, r
	}
	m := d.modules[h]
	if m == nil {
		return 0, 0, ErrorInvalidHandle
	}
	if r := d.loaded(m); r != Success {
		return 0, 0, r
	}
	d.makePrivate(m) // its variables are the program's now: no later load shares them
	if !m.raw && !m.globals[name] {
		return 0, 0, ErrorNotFound
	}
	for base, g := range d.globals {
		if g.module == h && g.name == name {
			return base, g.size, Success
		}
	}
	return d.moduleGetGlobal(h, m, name)
}
