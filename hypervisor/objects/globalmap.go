package objects

import (
	"math"
	"slices"

	"github.com/vgpuha/vgpuha/handlemap"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Module variables' addresses across nodes. A guest asks where a module
// variable lies (cuModuleGetGlobal) and may hand that address to a kernel:
// XLA passes its constants, which are module variables, to its own kernels
// and to cuBLAS's GEMMs, inside the structure of arguments a GEMM takes.
// Each node's GPU driver puts module variables where it likes, so the
// address the guest holds names the primary's copy. The primary logs every
// address it hands out (replicate.OpGlobalAddr); a standby finds its own
// copy of the same variable and, in every launch, replaces each argument
// word that lies inside a variable the guest holds at another address with
// the address in its own copy (an 8-byte argument, or an 8-byte-aligned
// word of a structure). After a failover the promoted node goes on doing
// so, and a resync carries the addresses the guest holds to a new standby.
//
// Not covered here: an address the guest stored in device memory (a kernel
// that follows it reaches the primary's address; GPU workers lay out their
// address space alike so that the variable lies there on both nodes, and
// NoteGlobalAddr tells the caller where it does not), and a word that is not
// an address but equals one inside such a variable (not a plausible value:
// these addresses lie far above any count or size).

// globalRef is one module variable whose address the guest holds.
type globalRef struct {
	module     uint64 // the guest's module handle
	name       string
	guest, own uint64 // where the guest believes it lies; where it lies here
	size       uint64
}

// globalMap holds the module variables a session's guest was told about,
// by the address the guest holds.
type globalMap struct {
	refs    map[uint64]globalRef
	foreign []globalRef // refs whose guest address is not this node's, by guest address
	// lo and hi bound the foreign refs' guest ranges, [lo, hi): a word
	// outside (nearly every argument word a launch has) is not searched
	// for. Mapping took a standby applying sixteen guests' logs a tenth of
	// its CPU, most of it searches for words no variable holds.
	lo, hi uint64
}

// note records ref, replacing what the guest address named before.
func (m *globalMap) note(ref globalRef) {
	if m.refs == nil {
		m.refs = map[uint64]globalRef{}
	}
	m.refs[ref.guest] = ref
	m.foreign = m.foreign[:0]
	for _, r := range m.refs {
		if r.guest != r.own {
			m.foreign = append(m.foreign, r)
		}
	}
	slices.SortFunc(m.foreign, func(a, b globalRef) int {
		switch {
		case a.guest < b.guest:
			return -1
		case a.guest > b.guest:
			return 1
		}
		return 0
	})
	m.lo, m.hi = 0, 0
	for i, r := range m.foreign {
		end := r.guest + r.size
		if end < r.guest {
			end = math.MaxUint64 // a range to the top of the address space
		}
		if i == 0 {
			m.lo = r.guest
		}
		m.hi = max(m.hi, end)
	}
}

// local is v as this node knows it: inside a foreign variable, the same
// offset in this node's copy; anything else as it is.
func (m *globalMap) local(v uint64) uint64 {
	if v < m.lo || v >= m.hi {
		return v
	}
	return m.search(v)
}

// search is local without the bounds check.
func (m *globalMap) search(v uint64) uint64 {
	i, _ := slices.BinarySearchFunc(m.foreign, v, func(r globalRef, v uint64) int {
		switch {
		case r.guest+r.size <= v:
			return -1
		case r.guest > v:
			return 1
		}
		return 0
	})
	if i < len(m.foreign) && v >= m.foreign[i].guest && v-m.foreign[i].guest < m.foreign[i].size {
		return m.foreign[i].own + (v - m.foreign[i].guest)
	}
	return v
}

// holding returns the variable whose guest address range holds [v, v+n).
func (m *globalMap) holding(v, n uint64) (globalRef, bool) {
	for _, r := range m.refs {
		if v >= r.guest && v-r.guest <= r.size && n <= r.size-(v-r.guest) {
			return r, true
		}
	}
	return globalRef{}, false
}

// args is a launch's arguments with every address inside a foreign
// variable made local (abi.MapAddresses): args itself when there is none.
func (m *globalMap) args(args []abi.Arg) []abi.Arg {
	if len(m.foreign) == 0 {
		return args
	}
	return abi.MapAddresses(args, m.local)
}

// NoteGlobalAddr records that the guest holds module variable r at guest
// (a replicated OpGlobalAddr): this node's copy is found by name. It
// returns where the copy lies here; where that is not guest, launch
// arguments are mapped, but an address the guest stored in device memory
// names nothing of it here.
func (o *Set) NoteGlobalAddr(r *abi.ModuleGlobal, guest uint64) (own uint64, err error) {
	_, own, size, err := o.global(r.Module, r.Name, 0, 0)
	if err != nil {
		return 0, err
	}
	o.globals.note(globalRef{module: r.Module, name: r.Name, guest: guest, own: own, size: size})
	return own, nil
}

// GlobalRecords calls emit with each module variable whose address the
// guest holds, and that address: what a resync's snapshot logs after the
// modules, so a new standby maps them too.
func (o *Set) GlobalRecords(emit func(r *abi.ModuleGlobal, guest uint64)) {
	for _, ref := range o.globals.refs {
		if _, err := o.handles.Lookup(handlemap.KindModule, handlemap.Handle(ref.module)); err == nil {
			emit(&abi.ModuleGlobal{Module: ref.module, Name: ref.name}, ref.guest)
		}
	}
}
