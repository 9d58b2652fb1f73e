// Package bufpool owns the replication log's record buffers: large ones
// reused instead of paid for again in page faults, made ahead on another
// goroutine while a log only grows, and, on a GPU primary, page-locked
// host buffers the device copies drafts from (Pool).
//
// It hands out and takes back memory only: it never reads or writes what
// a buffer holds (but the one byte per page that makes a fresh buffer
// real), and never frees a host buffer.
package bufpool

import (
	"os"
	"sync"
)

// Pool keeps large buffers for reuse. A fresh buffer is paid for in
// page faults on first touch: measured on this project's 2-core VMs, a
// copy into a new 16 MiB slice ran at 0.19 GB/s, into a reused one at
// 12.9 GB/s. The log takes each retained record's buffer from here and
// gives it back once the standby applied it and the sender is done with
// it; at most max idle bytes are kept.
//
// A log that grows (guests writing while a standby joins: everything after
// the snapshot's position stays until the standby has it) finds no free
// buffer and takes fresh ones at every append. With ahead set, a miss
// starts a goroutine that makes buffers of the size that missed, every
// page written, until ahead bytes of them wait: the guest's goroutine
// copies into memory that is there, and the faults are taken on another
// core, off the guest's call. On the two-H200 host (32 cores) a 256 KiB
// copy into a growing log took 136 µs of the caller with fresh buffers, 72
// µs with buffers made ahead (BenchmarkGrowingLogCopy), and guests kept
// 0.79-0.86 of their call rate during 4 and 16 GiB resyncs against
// 0.68-0.79 (bench resync, two runs each).
//
// With host buffers set (Log.SetHostBuffers), large drafts come from
// their allocator instead: page-locked memory the GPU copies from at DMA
// rate. Those are made once, up to a limit in all, and kept for reuse
// however many are idle (the allocator's memory is never freed).
type Pool struct {
	mu   sync.Mutex
	free [][]byte
	idle int
	// Max bounds the idle bytes kept (set before use).
	Max int

	// Ahead: the idle bytes a refill makes ready (0: none; set before
	// use); refilling
	// while one runs, refillSize the size it makes (the last that missed).
	Ahead      int
	refilling  bool
	refillSize int

	hostAlloc func(n int) ([]byte, error) // nil: no host buffers
	hostLimit int                         // bytes of host buffers made at most
	hostMade  int
	hostFree  [][]byte
	hostBufs  map[*byte]bool // every host buffer made, by its first byte
}

// SetHost makes large buffers (GetHost) come from alloc, up to limit
// bytes in all, kept for reuse and never freed (see Pool). Call before
// the pool is used.
func (p *Pool) SetHost(alloc func(n int) ([]byte, error), limit int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hostAlloc, p.hostLimit, p.hostBufs = alloc, limit, map[*byte]bool{}
}

// all (an allocator that refused once lowers it to what was made).
func (p *Pool) HostLimit() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hostLimit
}

// hostAbove: drafts of at least this many bytes may be host buffers (a
// bulk copy's pieces); smaller ones copy fast enough from any memory.
const hostAbove = 1 << 20

// poolStep rounds pooled buffers' sizes: sizes of one kind (a bulk copy's
// 16 MiB pieces) share buffers.
const poolStep = 64 << 10

// poolAbove: buffers smaller than this come from the allocator (Go keeps
// small objects in reused spans).
const poolAbove = 32 << 10

// Get returns a buffer of length 0 and capacity at least n, reused when
// one that is not much larger is free.
func (p *Pool) Get(n int) []byte {
	if n < poolAbove {
		return make([]byte, 0, n)
	}
	p.mu.Lock()
	b := takeFit(&p.free, n)
	p.idle -= cap(b)
	if b == nil {
		p.startRefill(pooledSize(n))
	}
	p.mu.Unlock()
	if b != nil {
		return b
	}
	return make([]byte, 0, pooledSize(n))
}

// startRefill has buffers of size made ahead, unless a refill runs (it
// then makes this size from its next buffer on) or none is wanted.
// Precondition: p.mu must be locked.
func (p *Pool) startRefill(size int) {
	if p.Ahead == 0 {
		return
	}
	p.refillSize = size
	if !p.refilling {
		p.refilling = true
		go p.refill()
	}
}

// refill makes buffers of refillSize, every page written, and frees each
// as it is made, until ahead idle bytes (or the pool's bound) are reached.
func (p *Pool) refill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		size := p.refillSize
		if p.idle+size > min(p.Ahead, p.Max) {
			p.refilling = false
			return
		}
		p.mu.Unlock()
		b := Touched(make([]byte, 0, size))
		p.mu.Lock()
		p.free = append(p.free, b)
		p.idle += cap(b)
	}
}

// Touched writes a byte into every page of b's capacity and returns b: a
// page is not there until first written (see Pool).
func Touched(b []byte) []byte {
	all := b[:cap(b)]
	for off := 0; off < len(all); off += os.Getpagesize() {
		all[off] = 1
	}
	return b
}

// takeFit removes and returns (empty) a buffer of free with room for n
// bytes and not much more, or nil.
func takeFit(free *[][]byte, n int) []byte {
	for i, b := range *free {
		if c := cap(b); c >= n && c-n <= n/4 {
			(*free)[i] = (*free)[len(*free)-1]
			*free = (*free)[:len(*free)-1]
			return b[:0]
		}
	}
	return nil
}

// pooledSize is the capacity a new pooled buffer for n bytes gets.
func pooledSize(n int) int { return (n + poolStep - 1) / poolStep * poolStep }

// GetHost is get for a draft: a host buffer while there are any to be
// had, else an ordinary one.
func (p *Pool) GetHost(n int) []byte {
	if n >= hostAbove {
		if b := p.takeHost(n); b != nil {
			return b
		}
	}
	return p.Get(n)
}

// takeHost returns a free or new host buffer with room for n bytes, or nil
// when there is none to be had.
func (p *Pool) takeHost(n int) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hostAlloc == nil {
		return nil
	}
	if b := takeFit(&p.hostFree, n); b != nil {
		return b
	}
	size := pooledSize(n)
	if p.hostMade+size > p.hostLimit {
		return nil
	}
	b, err := p.hostAlloc(size)
	if err != nil || cap(b) < n {
		p.hostLimit = p.hostMade // the allocator refused: make no more
		return nil
	}
	p.hostMade += cap(b)
	p.hostBufs[&b[:1][0]] = true
	return b[:0]
}

// Put gives b back for reuse; the caller must not touch it again.
func (p *Pool) Put(b []byte) {
	if cap(b) < poolAbove {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hostBufs[&b[:1][0]] {
		p.hostFree = append(p.hostFree, b[:0])
		return
	}
	if p.idle+cap(b) > p.Max {
		return // the garbage collector takes it
	}
	p.free = append(p.free, b[:0])
	p.idle += cap(b)
}
