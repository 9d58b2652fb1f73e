package cuapi

import (
	"os"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Modules kept by content. Libraries load the same image again and again
// (a ResNet's cuDNN made 914 loads and 582 unloads of cubins in its first
// step, and 11,431 function lookups: each a round trip, together about 4 s
// of its start-up). So a module the program unloads is parked,
// still loaded on the node (and on the standby), and a later load of the
// same image in the same context takes it back without a request, its
// functions with it, found by name without one either. Parked modules are
// bounded (maxParked, oldest unloaded first) and unloaded for real with
// their context.
//
// What differs from CUDA: a module taken back keeps its variables' values
// from before its unload, where CUDA's fresh load would start them from
// the image. So a PTX module that declares variables is never parked, nor
// a module whose variables the program asked for (cuModuleGetGlobal); a
// cubin's kernel that keeps state in a variable the program never names,
// across a reload, is not noticed.
// VGPUHA_MODULE_CACHE=0 turns parking off.

// maxParked bounds the parked modules of a process.
const maxParked = 256

// parkKey is a parked module's context and image.
type parkKey struct {
	ctx  uint64
	hash abi.ImageHash
}

// parkedModule is a module the program unloaded, kept loaded on the node,
// with its functions by name.
type parkedModule struct {
	m   *module
	fns map[string]*function
}

// moduleCacheOff is VGPUHA_MODULE_CACHE=0.
var moduleCacheOff = os.Getenv("VGPUHA_MODULE_CACHE") == "0"

// park keeps m, which the program unloads, loaded on the node instead, if
// it may be (loaded, no variable declared in its PTX or taken); ok is false when m must be
// unloaded now. A module pushed out by the bound is returned to unload.
// The caller forgets m's function handles (their structures are kept).
// Precondition: d.mu must be locked.
func (d *Driver) park(h uint64, m *module) (evicted *module, ok bool) {
	if moduleCacheOff || (!m.raw && len(m.globals) > 0) || m.lazy != nil || m.lazyErr != Success || m.hash == (abi.ImageHash{}) || d.hasGlobals(h) {
		return nil, false
	}
	key := parkKey{ctx: m.ctx, hash: m.hash}
	if d.parked[key] != nil {
		return nil, false // one copy parked is enough: unload this one
	}
	p := &parkedModule{m: m, fns: map[string]*function{}}
	for name, fn := range m.parkedFns { // taken back before, not all looked up again
		p.fns[name] = fn
	}
	for name, f := range m.funcs {
		p.fns[name] = d.funcs[f]
	}
	if d.parked == nil {
		d.parked = map[parkKey]*parkedModule{}
	}
	d.parked[key] = p
	d.parkOrder = append(d.parkOrder, key)
	if len(d.parkOrder) > maxParked {
		old := d.parkOrder[0]
		d.parkOrder = d.parkOrder[1:]
		if op := d.parked[old]; op != nil {
			delete(d.parked, old)
			return op.m, true
		}
	}
	return nil, true
}

// unpark takes back the module of ctx parked with image hash h, or nil.
// Precondition: d.mu must be locked.
func (d *Driver) unpark(ctx uint64, h abi.ImageHash) *parkedModule {
	key := parkKey{ctx: ctx, hash: h}
	p := d.parked[key]
	if p == nil {
		return nil
	}
	delete(d.parked, key)
	for i, k := range d.parkOrder {
		if k == key {
			d.parkOrder = append(d.parkOrder[:i], d.parkOrder[i+1:]...)
			break
		}
	}
	return p
}

// unloadParked unloads for real every module parked in ctx (its context
// ends).
// Precondition: d.mu must be locked.
func (d *Driver) unloadParked(ctx uint64) {
	keep := d.parkOrder[:0]
	for _, k := range d.parkOrder {
		if k.ctx != ctx {
			keep = append(keep, k)
			continue
		}
		if p := d.parked[k]; p != nil {
			d.client.UnloadModule(p.m.remote)
		}
		delete(d.parked, k)
	}
	d.parkOrder = keep
}

// hasGlobals reports whether the program took a variable of module h.
// Precondition: d.mu must be locked.
func (d *Driver) hasGlobals(h uint64) bool {
	for _, g := range d.globals {
		if g.module == h {
			return true
		}
	}
	return false
}
