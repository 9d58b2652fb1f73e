package link

import (
	"bytes"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// TestRegionCarvesExactSizesInOrder: a page-locked region lends each
// buffer as large as asked (rounded to regionAlign), one after another,
// wraps to its start when the end is too short, and reuses space only once
// every older buffer is back.
func TestRegionCarvesExactSizesInOrder(t *testing.T) {
	b := NewLender(1 << 20)
	b.UseRegion(make([]byte, 1<<20))
	a := b.borrow(300 << 10)
	c := b.borrow(256<<10 + 64) // a 256 KiB copy's record
	if cap(a) != 300<<10 || cap(c) != 256<<10+regionAlign {
		t.Fatalf("capacities %d and %d: want %d and %d", cap(a), cap(c), 300<<10, 256<<10+regionAlign)
	}
	d := b.borrow(400 << 10) // 1024-300-256.25 KiB left: fits before the end
	b.Give(c)
	got := make(chan []byte)
	go func() { got <- b.borrow(200 << 10) }() // space at the start only once a is back
	select {
	case <-got:
		t.Fatal("lent space that an older buffer still holds")
	case <-time.After(50 * time.Millisecond):
	}
	b.Give(a)
	e := <-got
	if &e[0] != &b.ring.mem[0] {
		t.Fatal("the buffer after a wrap is not at the region's start")
	}
	b.Give(d)
	b.Give(e)
	if b.lentNow != 0 || len(b.ring.spans) != 0 || len(b.ring.ids) != 0 {
		t.Fatalf("after every buffer came back: %d bytes lent, %d spans, %d ids", b.lentNow, len(b.ring.spans), len(b.ring.ids))
	}
	if big := b.borrow(2 << 20); cap(big) < 2<<20 {
		t.Fatalf("a buffer larger than the region: capacity %d", cap(big))
	}
}

// TestRegionBuffersNeverOverlap: borrowers of random sizes fill their
// buffers, hold them a random while and give them back in random order;
// every buffer still holds what its borrower wrote when it is given back,
// and nothing stays lent.
func TestRegionBuffersNeverOverlap(t *testing.T) {
	b := NewLender(4 << 20)
	b.UseRegion(make([]byte, 4<<20))
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			for i := range 300 {
				n := 1 + rng.IntN(700<<10)
				buf := b.borrow(n)
				if len(buf) != n {
					t.Errorf("asked %d bytes, lent %d", n, len(buf))
					return
				}
				tag := byte(w*31 + i)
				for j := range buf {
					buf[j] = tag
				}
				time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
				if !bytes.Equal(buf, bytes.Repeat([]byte{tag}, n)) {
					t.Errorf("borrower %d: a buffer changed while lent", w)
				}
				b.Give(buf)
			}
		})
	}
	wg.Wait()
	if b.lentNow != 0 || len(b.ring.spans) != 0 {
		t.Fatalf("%d bytes and %d spans still lent", b.lentNow, len(b.ring.spans))
	}
}
