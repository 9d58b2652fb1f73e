// Package handlemap owns the correspondence between what a guest holds and
// what a backend holds: virtual guest handles for modules, functions and
// streams (Table), and the set of device-address ranges a guest has
// allocated (Ranges).
//
// Guest handles are virtual and stable: a guest never sees a backend's own
// handle. They are numbered 1, 2, 3... per session in the order objects are
// created, so a standby that replays the same operations hands out the
// same numbers, and a guest's handles keep working after failover whatever
// the new backend's own handles are.
//
// Objects have parents: a function belongs to the module it came from.
// Removing an object removes its dependants first, children before parents.
//
// A Table or Ranges is not safe for concurrent use; its owner (one session)
// serializes access. It is a pure map: it never calls a backend, the
// network or the log.
package handlemap

import (
	"errors"
	"fmt"
	"sort"
)

// Kind is an object kind.
type Kind uint8

// Object kinds.
const (
	KindInvalid Kind = iota
	KindModule
	KindFunction
	KindStream
)

func (k Kind) String() string {
	switch k {
	case KindModule:
		return "module"
	case KindFunction:
		return "function"
	case KindStream:
		return "stream"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Handle is a guest-visible handle. Zero is never a valid handle.
type Handle uint64

// ErrUnknown is wrapped by errors about a handle that does not exist or has
// another kind.
var ErrUnknown = errors.New("unknown handle")

type entry struct {
	kind     Kind
	backend  uint64
	parent   Handle
	children []Handle
}

// Table maps guest handles to backend handles.
type Table struct {
	next    Handle
	entries map[Handle]*entry
}

// NewTable returns an empty table.
func NewTable() *Table { return &Table{entries: map[Handle]*entry{}} }

// Next is the handle the next Insert will return.
func (t *Table) Next() Handle { return t.next + 1 }

// Insert records a new object and returns its guest handle. parent is zero
// or the handle of a live object the new one depends on.
func (t *Table) Insert(kind Kind, backend uint64, parent Handle) (Handle, error) {
	if parent != 0 && t.entries[parent] == nil {
		return 0, fmt.Errorf("%w: parent %d", ErrUnknown, parent)
	}
	t.next++
	h := t.next
	t.entries[h] = &entry{kind: kind, backend: backend, parent: parent}
	if parent != 0 {
		p := t.entries[parent]
		p.children = append(p.children, h)
	}
	return h, nil
}

// Lookup returns the backend handle behind h, which must be of kind k.
func (t *Table) Lookup(k Kind, h Handle) (uint64, error) {
	e := t.entries[h]
	if e == nil || e.kind != k {
		return 0, fmt.Errorf("%w: no %s %d", ErrUnknown, k, h)
	}
	return e.backend, nil
}

// Removed describes one object dropped by Remove.
type Removed struct {
	Kind    Kind
	Handle  Handle
	Backend uint64
}

// Remove drops h (of kind k) and every object that depends on it, and
// returns them children first, so a caller can release backend objects in a
// safe order.
func (t *Table) Remove(k Kind, h Handle) ([]Removed, error) {
	e := t.entries[h]
	if e == nil || e.kind != k {
		return nil, fmt.Errorf("%w: no %s %d", ErrUnknown, k, h)
	}
	var out []Removed
	t.remove(h, &out)
	if p := t.entries[e.parent]; p != nil {
		for i, c := range p.children {
			if c == h {
				p.children = append(p.children[:i], p.children[i+1:]...)
				break
			}
		}
	}
	return out, nil
}

func (t *Table) remove(h Handle, out *[]Removed) {
	e := t.entries[h]
	for _, c := range e.children {
		t.remove(c, out)
	}
	delete(t.entries, h)
	*out = append(*out, Removed{Kind: e.kind, Handle: h, Backend: e.backend})
}

// Len is the number of live objects.
func (t *Table) Len() int { return len(t.entries) }

// Each calls fn for every live object in handle order.
func (t *Table) Each(fn func(h Handle, k Kind, backend uint64, parent Handle)) {
	hs := make([]Handle, 0, len(t.entries))
	for h := range t.entries {
		hs = append(hs, h)
	}
	sort.Slice(hs, func(i, j int) bool { return hs[i] < hs[j] })
	for _, h := range hs {
		e := t.entries[h]
		fn(h, e.kind, e.backend, e.parent)
	}
}

// Range is one allocated device-address range.
type Range struct{ Addr, Size uint64 }

// End is the first address past the range.
func (r Range) End() uint64 { return r.Addr + r.Size }

// Ranges is a set of non-overlapping device-address ranges, kept sorted.
type Ranges struct {
	rs    []Range
	total uint64
}

// ErrOverlap is returned when inserting a range that overlaps another.
var ErrOverlap = errors.New("range overlaps an existing allocation")

// Insert adds [addr, addr+size).
func (s *Ranges) Insert(addr, size uint64) error {
	if size == 0 || addr+size < addr {
		return fmt.Errorf("empty or wrapping range [%#x, +%d)", addr, size)
	}
	i := sort.Search(len(s.rs), func(i int) bool { return s.rs[i].Addr >= addr })
	if (i > 0 && s.rs[i-1].End() > addr) || (i < len(s.rs) && s.rs[i].Addr < addr+size) {
		return fmt.Errorf("%w: [%#x, +%d)", ErrOverlap, addr, size)
	}
	s.rs = append(s.rs, Range{})
	copy(s.rs[i+1:], s.rs[i:])
	s.rs[i] = Range{Addr: addr, Size: size}
	s.total += size
	return nil
}

// Remove drops the range that starts exactly at addr and returns it.
func (s *Ranges) Remove(addr uint64) (Range, bool) {
	i := sort.Search(len(s.rs), func(i int) bool { return s.rs[i].Addr >= addr })
	if i == len(s.rs) || s.rs[i].Addr != addr {
		return Range{}, false
	}
	r := s.rs[i]
	s.rs = append(s.rs[:i], s.rs[i+1:]...)
	s.total -= r.Size
	return r, true
}

// Find returns the range that wholly contains [addr, addr+n), if any. A
// zero-length access must still point inside a range.
func (s *Ranges) Find(addr, n uint64) (Range, bool) {
	i := sort.Search(len(s.rs), func(i int) bool { return s.rs[i].Addr > addr }) - 1
	if i < 0 {
		return Range{}, false
	}
	r := s.rs[i]
	off := addr - r.Addr
	if off >= r.Size || n > r.Size-off {
		return Range{}, false
	}
	return r, true
}

// Len is the number of ranges; Total their summed size.
func (s *Ranges) Len() int      { return len(s.rs) }
func (s *Ranges) Total() uint64 { return s.total }

// All returns the ranges in address order. The slice must not be modified.
func (s *Ranges) All() []Range { return s.rs }

// FirstFit returns the lowest address in [base, base+size) aligned to align
// where n bytes fit between existing ranges. Deterministic: the same history
// of inserts and removes always gives the same answer.
func (s *Ranges) FirstFit(base, size, n, align uint64) (uint64, bool) {
	if n == 0 || n > size {
		return 0, false
	}
	end := base + size
	cand := alignUp(base, align)
	for _, r := range s.rs {
		if r.End() <= cand {
			continue
		}
		if r.Addr >= cand && r.Addr-cand >= n {
			break
		}
		cand = alignUp(r.End(), align)
	}
	if cand < base || cand > end || end-cand < n {
		return 0, false
	}
	return cand, true
}

func alignUp(v, a uint64) uint64 { return (v + a - 1) &^ (a - 1) }

// SetNext makes the next Insert return h. It is used when rebuilding a
// table from a snapshot, whose handle numbering may have gaps; h must be
// above every live handle.
func (t *Table) SetNext(h Handle) error {
	for live := range t.entries {
		if live >= h {
			return fmt.Errorf("next handle %d is not above live handle %d", h, live)
		}
	}
	t.next = h - 1
	return nil
}
