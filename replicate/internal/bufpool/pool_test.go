package bufpool

import (
	"os"
	"testing"
	"time"
)

func TestBufPool(t *testing.T) {
	p := Pool{Max: 3 << 20}
	a := p.Get(1 << 20)
	if cap(a) < 1<<20 || len(a) != 0 {
		t.Fatalf("len %d cap %d", len(a), cap(a))
	}
	p.Put(a)
	if b := p.Get(100 << 10); cap(b) == cap(a) {
		t.Fatal("a 1 MiB buffer handed out for 100 KiB")
	}
	if b := p.Get(1<<20 - 10); &b[:1][0] != &a[:1][0] {
		t.Fatal("a fitting free buffer was not reused")
	}
	for range 4 {
		p.Put(make([]byte, 0, 1<<20))
	}
	if p.idle > p.Max {
		t.Fatalf("%d idle bytes kept, bound %d", p.idle, p.Max)
	}
}

// TestBufPoolRefillsAhead: a miss has buffers of its size made ahead,
// every page written, up to the pool's ahead bytes; the next get takes
// one of them.
func TestBufPoolRefillsAhead(t *testing.T) {
	const size = 256 << 10
	p := Pool{Max: 64 << 20, Ahead: 4 << 20}
	p.Get(size) // nothing free: a fresh buffer, and a refill
	deadline := time.Now().Add(10 * time.Second)
	for {
		p.mu.Lock()
		idle, refilling := p.idle, p.refilling
		p.mu.Unlock()
		if !refilling && idle > 0 {
			if idle > p.Ahead {
				t.Fatalf("%d bytes made ahead, bound %d", idle, p.Ahead)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no buffers made ahead after a miss (idle %d)", idle)
		}
		time.Sleep(time.Millisecond)
	}
	b := p.Get(size)
	p.mu.Lock()
	left := p.idle
	p.mu.Unlock()
	if left != p.Ahead-cap(b) {
		t.Fatalf("the get after a refill did not take a buffer made ahead: %d idle bytes left of %d", left, p.Ahead)
	}
	all := b[:cap(b)]
	for off := 0; off < len(all); off += os.Getpagesize() {
		if all[off] != 1 {
			t.Fatalf("page at %d of a buffer made ahead was never written", off)
		}
	}
}
