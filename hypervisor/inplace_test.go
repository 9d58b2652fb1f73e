package hypervisor_test

import (
	"bytes"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/vgpuha/vgpuha/internal/cluster"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// inPlaceSizes are copies around the in-place threshold, one that wraps
// the default 4 MiB ring, and one split into several frames.
var inPlaceSizes = []int{abi.InPlaceMin - 1, abi.InPlaceMin, abi.InPlaceMin + 3, 1 << 20, 5<<20 + 7, 17 << 20}

// copyAndCheck copies random data of every size to the device, on the
// null stream and on stream s, and reads each back.
func copyAndCheck(t *testing.T, g *pvdriver.Client, s pvdriver.Stream) (moved int) {
	t.Helper()
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range inPlaceSizes {
		want := make([]byte, n)
		for i := range want {
			want[i] = byte(r.Uint32())
		}
		p, err := g.Alloc(uint64(n))
		if err != nil {
			t.Fatal(err)
		}
		if err := g.CopyHtoD(p, want); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, n)
		if err := g.CopyDtoH(got, p); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%d-byte copy on the null stream: device holds other bytes", n)
		}
		want[0]++
		if err := g.CopyHtoDAsync(p, want, s); err != nil {
			t.Fatal(err)
		}
		if err := g.StreamSynchronize(s); err != nil {
			t.Fatal(err)
		}
		if err := g.CopyDtoH(got, p); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%d-byte copy on a stream: device holds other bytes", n)
		}
		g.Free(p)
		if n >= abi.InPlaceMin {
			moved += n
		}
	}
	return moved
}

// TestInPlaceCopies: over shared memory, large copies on the null stream
// go from the guest's ring straight to the device, those on a stream
// through a private buffer; both land intact, whatever their size.
func TestInPlaceCopies(t *testing.T) {
	e, _ := startShm(t)
	g := e.client(t, "g")
	s, err := g.CreateStream()
	if err != nil {
		t.Fatal(err)
	}
	moved := copyAndCheck(t, g, s)
	if got := counter(t, e, "vgpuha_guest_inplace_copy_bytes_total", map[string]string{"to": "device"}); got < float64(moved) {
		t.Fatalf("%v bytes went straight to the device, want %d", got, moved)
	}
	if got := counter(t, e, "vgpuha_guest_inplace_copy_bytes_total", map[string]string{"to": "private"}); got < float64(moved) {
		t.Fatalf("%v bytes of stream copies read privately, want %d", got, moved)
	}
}

// TestInPlaceCopiesReplicated: a replicated session reads in-place data
// once, into the log's buffer; the standby ends up identical (verify).
func TestInPlaceCopiesReplicated(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("shared memory needs Linux")
	}
	c := startPair(t, cluster.Options{GuestScheme: "shm+unix"})
	g := guest(t, c, "g")
	s, err := g.CreateStream()
	if err != nil {
		t.Fatal(err)
	}
	copyAndCheck(t, g, s)
	if rep, err := c.Verify(); err != nil || !rep.Match {
		t.Fatalf("verify: %v %+v", err, rep)
	}
}
