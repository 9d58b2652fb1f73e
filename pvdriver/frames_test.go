package pvdriver

import "testing"

// TestFrameReturnsOnLastRelease: a frame held by the writer and the kept
// list goes back to the pool only when both let go.
func TestFrameReturnsOnLastRelease(t *testing.T) {
	var p framePool
	f := &outFrame{pool: &p, b: p.get(100 << 10)}
	f.refs.Store(1) // the writer's
	f.hold()        // the kept list's
	f.release()
	if p.idle != 0 {
		t.Fatal("buffer pooled while still held")
	}
	f.release()
	if p.idle != 128<<10 {
		t.Fatalf("%d bytes idle after the last release, want %d", p.idle, 128<<10)
	}
	if b := p.get(100 << 10); cap(b) != 128<<10 || p.idle != 0 {
		t.Fatalf("the pooled buffer was not reused: cap %d, idle %d", cap(b), p.idle)
	}
}

// TestFramePoolBounded: the pool keeps at most maxIdle bytes.
func TestFramePoolBounded(t *testing.T) {
	var p framePool
	for range 2 * maxIdle / (16 << 20) {
		p.put(make([]byte, 0, 16<<20))
	}
	if p.idle > maxIdle {
		t.Fatalf("%d bytes idle, bound %d", p.idle, maxIdle)
	}
	p.put(make([]byte, 0, 3000)) // not a pooled class
	p.put(make([]byte, 0, 64<<20))
	if p.idle > maxIdle || len(p.free[3000]) != 0 || len(p.free[64<<20]) != 0 {
		t.Fatal("pooled a buffer outside the classes")
	}
}
