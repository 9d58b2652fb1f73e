package verify

import (
	"fmt"
	"sort"
	"sync"
	"time"
)

// Mismatch is one object that differs between primary and standby.
type Mismatch struct {
	Session    uint64 `json:"session"`
	Kind       string `json:"kind"`
	ID         string `json:"id"`
	Size       uint64 `json:"size"`
	Primary    string `json:"primary"`
	Standby    string `json:"standby"`
	Repairable bool   `json:"repairable"`
	// Object is the object's id (a memory object's guest address), for
	// repair.
	Object uint64 `json:"-"`
}

// Report is the outcome of one verification.
type Report struct {
	Match      bool       `json:"match"`
	Objects    int        `json:"objects"`
	Bytes      uint64     `json:"bytes"`
	Mismatches []Mismatch `json:"mismatches"`
	// Apertures: with --apertures, each aperture's file compared byte by
	// byte with its device copy on each node.
	Apertures []ApertureCheck `json:"apertures,omitempty"`
	Repaired  int             `json:"repaired,omitempty"`
}

// ApertureCheck is one aperture's bytes (the guest's file, the truth)
// compared with the device copy on the primary and on the standby.
type ApertureCheck struct {
	Session uint64       `json:"session"`
	ID      string       `json:"id"`
	Size    uint64       `json:"size"`
	Primary ApertureSide `json:"primary"`
	Standby ApertureSide `json:"standby"`
}

// ApertureSide is one node's device copy of an aperture against the file.
type ApertureSide struct {
	MismatchedBytes uint64 `json:"mismatched_bytes"`
	// FirstOffset is the first mismatched byte's offset, -1 for none.
	FirstOffset int64 `json:"first_offset"`
	// Missing: the node did not compare this aperture (no answer for it).
	Missing bool `json:"missing,omitempty"`
}

// Match reports whether the side holds the file's bytes.
func (s ApertureSide) Match() bool { return !s.Missing && s.MismatchedBytes == 0 }

func apertureSide(o ObjectSum, ok bool) ApertureSide {
	if !ok {
		return ApertureSide{Missing: true, FirstOffset: -1}
	}
	side := ApertureSide{MismatchedBytes: o.Size, FirstOffset: -1}
	if o.Sum != NoMismatch {
		side.FirstOffset = int64(min(o.Sum, 1<<62))
	}
	return side
}

// compareApertures pairs the primary's ObjAperture entries with the
// standby's, in the primary's order, and returns the other entries of
// each list.
func compareApertures(primary, standby []ObjectSum) (checks []ApertureCheck, p, s []ObjectSum) {
	type key struct{ s, id uint64 }
	size := map[key]uint64{}
	stby := map[key]ObjectSum{}
	for _, o := range primary {
		if o.Kind == ObjMemory {
			size[key{o.Session, o.ID}] = o.Size
		}
	}
	for _, o := range standby {
		if o.Kind == ObjAperture {
			stby[key{o.Session, o.ID}] = o
		} else {
			s = append(s, o)
		}
	}
	for _, o := range primary {
		if o.Kind != ObjAperture {
			p = append(p, o)
			continue
		}
		k := key{o.Session, o.ID}
		so, ok := stby[k]
		checks = append(checks, ApertureCheck{Session: o.Session, ID: fmt.Sprintf("%#x", o.ID), Size: size[k],
			Primary: apertureSide(o, true), Standby: apertureSide(so, ok)})
	}
	return checks, p, s
}

// Compare matches the primary's checksums with the standby's, taken at the
// same log position, and reports each aperture both compared byte by byte
// (ObjAperture entries).
func Compare(primary, standby []ObjectSum) Report {
	checks, primary, standby := compareApertures(primary, standby)
	rep := compareSums(primary, standby)
	rep.Apertures = checks
	for _, c := range checks {
		rep.Match = rep.Match && c.Primary.Match() && c.Standby.Match()
	}
	return rep
}

func compareSums(primary, standby []ObjectSum) Report {
	type key struct {
		s  uint64
		k  ObjectKind
		id uint64
	}
	stby := map[key]ObjectSum{}
	for _, o := range standby {
		stby[key{o.Session, o.Kind, o.ID}] = o
	}
	rep := Report{Match: true, Mismatches: []Mismatch{}}
	var order []key // mismatches' keys, for sorting
	show := func(o ObjectSum) string { return fmt.Sprintf("%016x", o.Sum) }
	for _, p := range primary {
		rep.Objects++
		rep.Bytes += p.Size
		k := key{p.Session, p.Kind, p.ID}
		s, ok := stby[k]
		delete(stby, k)
		if ok && s.Sum == p.Sum && s.Size == p.Size {
			continue
		}
		m := Mismatch{Session: p.Session, Kind: p.Kind.String(), ID: fmt.Sprintf("%#x", p.ID), Object: p.ID, Size: p.Size,
			Primary: show(p), Standby: "missing", Repairable: p.Kind == ObjMemory && ok && s.Size == p.Size}
		if ok {
			m.Standby = show(s)
		}
		rep.Mismatches = append(rep.Mismatches, m)
		order = append(order, k)
	}
	for _, s := range standby {
		if k := (key{s.Session, s.Kind, s.ID}); stby[k] == s {
			rep.Mismatches = append(rep.Mismatches, Mismatch{Session: s.Session, Kind: s.Kind.String(),
				ID: fmt.Sprintf("%#x", s.ID), Object: s.ID, Size: s.Size, Primary: "missing", Standby: show(s)})
			order = append(order, k)
		}
	}
	idx := make([]int, len(order))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(i, j int) bool {
		a, b := order[idx[i]], order[idx[j]]
		if a.s != b.s {
			return a.s < b.s
		}
		if a.k != b.k {
			return a.k < b.k
		}
		return a.id < b.id
	})
	sorted := make([]Mismatch, len(idx))
	for i, j := range idx {
		sorted[i] = rep.Mismatches[j]
	}
	rep.Mismatches = sorted
	rep.Match = len(rep.Mismatches) == 0
	return rep
}

// Verifier pairs verify points taken on the primary with the standby's
// answers, which arrive on the replication link.
type Verifier struct {
	mu      sync.Mutex
	next    uint64
	waiting map[uint64]chan []ObjectSum
}

// Deliver hands the standby's checksums for verification id to its waiter
// (the sender calls it when the answer arrives).
func (v *Verifier) Deliver(id uint64, sums []ObjectSum) {
	v.mu.Lock()
	ch := v.waiting[id]
	delete(v.waiting, id)
	v.mu.Unlock()
	if ch != nil {
		ch <- sums
	}
}

// Verify takes a verify point with point (which computes the primary's
// checksums and logs the request at the same position) and compares the
// standby's answer.
func (v *Verifier) Verify(point func(id uint64) []ObjectSum, timeout time.Duration) (Report, error) {
	v.mu.Lock()
	if v.waiting == nil {
		v.waiting = map[uint64]chan []ObjectSum{}
	}
	v.next++
	id := v.next
	ch := make(chan []ObjectSum, 1)
	v.waiting[id] = ch
	v.mu.Unlock()
	primary := point(id)
	select {
	case standby := <-ch:
		return Compare(primary, standby), nil
	case <-time.After(timeout):
		v.mu.Lock()
		delete(v.waiting, id)
		v.mu.Unlock()
		return Report{}, fmt.Errorf("the standby did not answer verification %d within %v (is it attached and caught up?)", id, timeout)
	}
}
