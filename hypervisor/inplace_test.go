package hypervisor_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vgpuha/vgpuha/internal/lab/cluster"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/pvdriver/transport/shm"
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

// TestScribbledInPlaceDataReplicated: a hostile guest of a replicated pair
// keeps rewriting its request ring's bytes (frames and in-place copy data)
// while it copies. Whatever it loses, a neighbour's data stays right, and
// primary and standby stay identical (verify): the node read each copy's
// data once, into the log's buffer, and wrote the device from that copy.
func TestScribbledInPlaceDataReplicated(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("shared memory needs Linux")
	}
	c := startPair(t, cluster.Options{GuestScheme: "shm+unix"})
	conn, err := shm.Dial(context.Background(), strings.TrimPrefix(c.Endpoint, "shm+unix://"), shm.Options{RequestRing: shm.MinRing, ReplyRing: shm.MinRing})
	if err != nil {
		t.Fatal(err)
	}
	bad, err := pvdriver.NewClient(keepMapped{conn}, pvdriver.Options{GuestName: "scribbler"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	defer bad.Close()
	p, err := bad.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() { // the guest's other thread: only the request ring's bytes
		defer close(stopped)
		ring, r := conn.SharedMemory()[4096:4096+shm.MinRing], rand.New(rand.NewPCG(3, 4))
		for {
			select {
			case <-stop:
				return
			default:
			}
			for range 16 {
				ring[r.IntN(len(ring))] = byte(r.Uint32())
			}
			runtime.Gosched()
		}
	}()
	var copied atomic.Int64
	go func() {
		buf := make([]byte, 200<<10)
		for err := error(nil); err == nil; copied.Add(1) {
			if err = bad.CopyHtoD(p, buf); err == nil {
				err = bad.CopyDtoH(buf[:4096], p)
			}
		}
	}()
	g := guest(t, c, "neighbour")
	q := mustAlloc(t, g, 1<<20, 0)
	want := bytes.Repeat([]byte{0x5a, 0xa5, 3}, 300<<10/3)
	got := make([]byte, len(want))
	for range 20 {
		if err := g.CopyHtoD(q, want); err != nil {
			t.Fatal(err)
		}
		if err := g.CopyDtoH(got, q); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatal("a neighbour's data changed")
		}
	}
	close(stop)
	<-stopped
	t.Logf("the scribbling guest made %d copies", copied.Load())
	if rep, err := c.Verify(); err != nil || !rep.Match {
		t.Fatalf("primary and standby differ: %v %+v", err, rep)
	}
}
