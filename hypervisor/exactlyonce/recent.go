package exactlyonce

// recent keeps a value for each of the latest request ids: the value of
// id sits in slot id%size until a later id of the same slot takes it, so
// any id within size of the newest one put is kept, at a constant cost per
// request (a map pruned when full walked all its entries, on every request
// once all of them were recent). Its memory is taken at the first put,
// which fixes its size; the zero value is empty.
type recent[V any] struct {
	ids  []uint64
	vals []V
}

// put keeps v for request id (never 0); size is how many ids are kept,
// fixed by the first put.
func (r *recent[V]) put(id uint64, v V, size int) {
	if r.ids == nil {
		r.ids, r.vals = make([]uint64, size), make([]V, size)
	}
	i := id % uint64(len(r.ids))
	r.ids[i], r.vals[i] = id, v
}

// get returns the value kept for request id, if it is kept.
func (r *recent[V]) get(id uint64) (v V, ok bool) {
	if r.ids == nil || id == 0 {
		return v, false
	}
	i := id % uint64(len(r.ids))
	if r.ids[i] != id {
		return v, false
	}
	return r.vals[i], true
}

// drop forgets request id's value.
func (r *recent[V]) drop(id uint64) {
	if _, ok := r.get(id); ok {
		var zero V
		i := id % uint64(len(r.ids))
		r.ids[i], r.vals[i] = 0, zero
	}
}
