package cuapi

import (
	"os"

	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Modules kept by content. Libraries load the same image again and again,
// often while an earlier copy is still loaded (a ResNet's cuDNN made 914
// loads and 582 unloads of cubins in its first step, and 11,431 function
// lookups: each a round trip, together about 4 s of its start-up). So the
// library keeps one node module per image and context:
//
//   - a load of an image already loaded takes another handle to the same
//     node module, with no request; its functions are found by name
//     without one either (each handle has its own function handles);
//   - an unload counts the handles down; when the last goes, the module
//     is parked, still loaded on the node (and on the standby), for the
//     next load of the image; parked modules are bounded (maxParked,
//     oldest unloaded first) and unloaded for real with their context.
//
// What differs from CUDA: two loads of one image share the module's
// variables, and a module taken back from the parked ones keeps their
// values, where CUDA's loads each start them from the image. So a PTX
// module that declares variables is never shared, and a module whose
// variables the program asks for (cuModuleGetGlobal) is not shared from
// then on and is unloaded for real with its last handle; a cubin's kernel
// that keeps state in a variable the program never names is not noticed.
// VGPUHA_MODULE_CACHE=0 turns sharing off.

// maxParked bounds the parked modules of a process.
const maxParked = 256

// imageKey is a shared module's context and image.
type imageKey struct {
	ctx  uint64
	hash abi.ImageHash
}

// sharedModule is a node module that handles of one image share.
type sharedModule struct {
	key     imageKey
	remote  pvdriver.Module
	refs    int                  // the program's handles to it; 0: parked
	fns     map[string]*function // functions any handle looked up, by name
	private bool                 // a variable was asked for: no new handle shares it
}

// moduleCacheOff is VGPUHA_MODULE_CACHE=0.
var moduleCacheOff = os.Getenv("VGPUHA_MODULE_CACHE") == "0"

// shareable reports whether module m, just built from its image, may be
// shared: not a PTX module that declares variables.
func shareable(m *module) bool {
	return !moduleCacheOff && (m.raw || len(m.globals) == 0)
}

// takeShared is the loaded or parked module of ctx with image hash h,
// with one handle more, or nil.
// Precondition: d.mu must be locked.
func (d *Driver) takeShared(ctx uint64, h abi.ImageHash) *sharedModule {
	s := d.shared[imageKey{ctx: ctx, hash: h}]
	if s == nil || moduleCacheOff {
		return nil
	}
	if s.refs == 0 {
		d.unpark(s.key)
	}
	s.refs++
	return s
}

// share records m, just loaded on the node, as the module of its image.
// Precondition: d.mu must be locked.
func (d *Driver) share(m *module) {
	if !shareable(m) {
		return
	}
	if d.shared == nil {
		d.shared = map[imageKey]*sharedModule{}
	}
	s := &sharedModule{key: imageKey{ctx: m.ctx, hash: m.hash}, remote: m.remote, refs: 1, fns: map[string]*function{}}
	if d.shared[s.key] == nil {
		d.shared[s.key] = s
	}
	m.shared = s
}

// makePrivate keeps m's module from new handles: the program asked for
// one of its variables.
// Precondition: d.mu must be locked.
func (d *Driver) makePrivate(m *module) {
	if s := m.shared; s != nil && !s.private {
		s.private = true
		if d.shared[s.key] == s {
			delete(d.shared, s.key)
		}
	}
}

// release drops one handle of shared module s: whether the node module
// must be unloaded now, and a parked module pushed out by the bound to
// unload as well.
// Precondition: d.mu must be locked.
func (d *Driver) release(s *sharedModule) (unload bool, evicted *sharedModule) {
	if s.refs--; s.refs > 0 {
		return false, nil
	}
	if s.private || moduleCacheOff || d.shared[s.key] != s {
		return true, nil
	}
	d.parkOrder = append(d.parkOrder, s.key)
	if len(d.parkOrder) <= maxParked {
		return false, nil
	}
	old := d.parkOrder[0]
	d.parkOrder = d.parkOrder[1:]
	evicted = d.shared[old]
	delete(d.shared, old)
	return false, evicted
}

// unpark takes key off the parked list.
// Precondition: d.mu must be locked.
func (d *Driver) unpark(key imageKey) {
	for i, k := range d.parkOrder {
		if k == key {
			d.parkOrder = append(d.parkOrder[:i], d.parkOrder[i+1:]...)
			return
		}
	}
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
		if s := d.shared[k]; s != nil {
			d.client.UnloadModule(s.remote)
		}
		delete(d.shared, k)
	}
	d.parkOrder = keep
}

// sharedFunction is function name of m's shared module as another handle
// looked it up (a copy for m's handle h), or nil.
func sharedFunction(m *module, h uint64, name string) *function {
	if m.shared == nil || m.shared.fns[name] == nil {
		return nil
	}
	fn := *m.shared.fns[name]
	fn.module = h
	return &fn
}
