package replicate

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
	Repaired   int        `json:"repaired,omitempty"`
}

// Compare matches the primary's checksums with the standby's, taken at the
// same log position.
func Compare(primary, standby []ObjectSum) Report {
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
