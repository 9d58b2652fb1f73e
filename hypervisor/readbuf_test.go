package hypervisor_test

import (
	"bytes"
	"runtime"
	"testing"

	"github.com/vgpuha/vgpuha/hypervisor"
)

// TestReadsReuseTheirBuffer: a session reads into the buffer of its last
// read (devmem's spare), and what every read returns is still exactly the
// device's bytes: a smaller read after a larger one, a second session's
// read, a read after a write. The node's allocations for a loop of large
// reads stay far below a fresh buffer per read (without the race
// detector: with a buffer per read, 131 MB for the 40 reads below; with
// the spare, 0.05-3.5 MB in four runs on the 2-core VM).
func TestReadsReuseTheirBuffer(t *testing.T) {
	e := start(t, hypervisor.DefaultConfig())
	a, b := e.client(t, "a"), e.client(t, "b")
	const big = 3 << 20
	pa := mustAlloc(t, a, big, 0xAA)
	if got := read(t, a, pa, big); !bytes.Equal(got, bytes.Repeat([]byte{0xAA}, big)) {
		t.Fatal("first read: wrong bytes")
	}
	pb := mustAlloc(t, b, 1<<20, 0xBB)
	if got := read(t, b, pb, 1<<20); !bytes.Equal(got, bytes.Repeat([]byte{0xBB}, 1<<20)) {
		t.Fatal("another session's read: wrong bytes")
	}
	small := mustAlloc(t, a, 4096, 0x11)
	if got := read(t, a, small, 4096); !bytes.Equal(got, bytes.Repeat([]byte{0x11}, 4096)) {
		t.Fatal("a smaller read after a larger one: wrong bytes")
	}
	if err := a.CopyHtoD(pa+100, []byte{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte{0xAA}, big)
	copy(want[100:], []byte{1, 2, 3})
	if got := read(t, a, pa, big); !bytes.Equal(got, want) {
		t.Fatal("a read after a write: wrong bytes")
	}

	if raceDetector {
		return // its sync.Pool drops buffers at random: the guest's frame buffers are then counted too
	}
	const reads = 40
	buf := make([]byte, big)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range reads {
		if err := a.CopyDtoH(buf, pa); err != nil {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&after)
	// A fresh buffer per read alone would be reads*big bytes on the node.
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("%d reads of %d bytes: %d bytes allocated", reads, big, alloc)
	if alloc > reads*big/2 {
		t.Errorf("%d reads of %d bytes allocated %d bytes (node and guest in this process): more than half a buffer per read", reads, big, alloc)
	}
}
