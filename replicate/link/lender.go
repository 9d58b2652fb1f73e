package link

import "sync"

// Lender keeps the receive buffers lent out to the applier (a record's
// body waiting to be applied stays in the buffer it arrived in: no copy)
// and bounds what is lent at once: past maxLent bytes the link stops
// reading until buffers come back, and TCP pushes back to the primary.
//
// Buffers come from the heap (a free list of whole buffers, a new one when
// none fits), or, on a GPU standby, from one page-locked region of
// maxLent bytes used as a ring (region): each buffer is carved where the
// newest lent one ends, exactly as large as asked, and the space comes
// back as the oldest buffers do. Page-locked buffers of 4 MiB each, the
// design before it, lent a 256 KiB record 4 MiB: a standby catching up
// from guests' 256 KiB copies held 64 records at once and settled its
// queued copies every 8 (measured on the H200 host: 45% of the
// applier's time waiting for the device).
type Lender struct {
	mu      sync.Mutex
	cond    *sync.Cond
	lentNow int // bytes lent (capacities)
	maxLent int
	free    [][]byte // heap: whole buffers given back
	ring    *region  // nil: heap
}

// Lent is how many bytes are lent now (capacities).
func (b *Lender) Lent() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lentNow
}

// NewLender returns a lender that lends at most maxLent bytes at once.
func NewLender(maxLent int) *Lender {
	b := &Lender{maxLent: maxLent}
	b.cond = sync.NewCond(&b.mu)
	return b
}

// UseRegion has every later buffer carved from mem (page-locked memory).
func (b *Lender) UseRegion(mem []byte) {
	b.mu.Lock()
	b.ring = &region{mem: mem, ids: map[*byte]uint64{}}
	b.mu.Unlock()
}

// borrow lends a buffer of at least n bytes, waiting while too much is
// lent (one larger than the region comes from the heap).
func (b *Lender) borrow(n int) []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r := b.ring; r != nil && regionSize(n) <= len(r.mem) {
		for {
			if buf, ok := r.carve(n); ok {
				b.lentNow += cap(buf)
				return buf
			}
			b.cond.Wait()
		}
	}
	for b.lentNow > 0 && b.lentNow+n > b.maxLent {
		b.cond.Wait()
	}
	buf := b.takeLocked(n)
	if buf == nil {
		buf = make([]byte, n)
	}
	b.lentNow += cap(buf)
	return buf
}

// Give returns a lent buffer.
func (b *Lender) Give(buf []byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lentNow -= cap(buf)
	b.cond.Broadcast()
	if b.ring != nil && b.ring.release(buf) {
		return
	}
	// Every heap buffer is kept: how many exist is bounded, since a new
	// one is made only when none free fits and at most maxLent bytes are
	// lent at once.
	b.free = append(b.free, buf[:cap(buf)])
}

// takeLocked returns a free heap buffer of at least n bytes, or nil.
// Precondition: b.mu must be locked.
func (b *Lender) takeLocked(n int) []byte {
	for i, buf := range b.free {
		if cap(buf) >= n {
			b.free = append(b.free[:i], b.free[i+1:]...)
			return buf
		}
	}
	return nil
}

// region is a ring of buffers carved from mem in the order they are lent.
// spans are the lent ones, oldest first (spans[0] has id first); a span
// given back early waits until every older one is back, then its space is
// reused.
type region struct {
	mem   []byte
	spans []span
	first uint64
	ids   map[*byte]uint64 // a lent buffer's first byte: its span's id
}

type span struct {
	start, end int
	back       bool
}

// regionAlign keeps buffers in the region 256-byte aligned (DMA-friendly).
const regionAlign = 256

func regionSize(n int) int { return (max(n, 1) + regionAlign - 1) &^ (regionAlign - 1) }

// carve returns a buffer of n bytes (capacity: n rounded up to
// regionAlign) after the newest one lent, or at the region's start when it
// does not fit before the end; false when the space is still lent.
func (r *region) carve(n int) ([]byte, bool) {
	size := regionSize(n)
	start := 0
	if len(r.spans) > 0 {
		head, tail := r.spans[len(r.spans)-1].end, r.spans[0].start
		switch {
		case head > tail && len(r.mem)-head >= size:
			start = head
		case head > tail && tail >= size:
			start = 0 // wrap
		case head <= tail && tail-head >= size:
			start = head
		default:
			return nil, false
		}
	}
	buf := r.mem[start : start+n : start+size]
	r.ids[&buf[0]] = r.first + uint64(len(r.spans))
	r.spans = append(r.spans, span{start: start, end: start + size})
	return buf, true
}

// release marks buf given back and frees the space of every span that is
// back in order; false when buf is not the region's (a heap buffer).
func (r *region) release(buf []byte) bool {
	id, ok := r.ids[&buf[:1][0]]
	if !ok {
		return false
	}
	delete(r.ids, &buf[:1][0])
	r.spans[id-r.first].back = true
	for len(r.spans) > 0 && r.spans[0].back {
		r.spans = r.spans[1:]
		r.first++
	}
	if len(r.spans) == 0 {
		r.spans = r.spans[:0:0] // let the deque's old array go
	}
	return true
}
