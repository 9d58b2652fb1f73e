package cuapi

import (
	"runtime"
	"testing"
	"unsafe"

	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// registered registers n bytes of Go memory as the program's host memory
// (as cuMemHostRegister would) and returns its address; the memory stays
// alive until the test ends.
func registered(t *testing.T, d *Driver, th Thread, n int) uintptr {
	t.Helper()
	buf := make([]byte, n)
	t.Cleanup(func() { runtime.KeepAlive(buf) })
	p := uintptr(unsafe.Pointer(&buf[0]))
	if r := d.HostRegister(th, p, uint64(n), 0); r != Success {
		t.Fatalf("HostRegister: %d", r)
	}
	return p
}

// mirrored is a driver with a context and 4096 bytes of registered host
// memory at p, mapped for the device (its mirror at dev).
func mirrored(t *testing.T) (d *Driver, p uintptr, dev uint64) {
	t.Helper()
	d, th, _ := driverWithContext(t)
	p = registered(t, d, th, 4096)
	dev, r := d.HostGetDevicePointer(th, p, 0)
	if r != Success {
		t.Fatalf("HostGetDevicePointer: %d", r)
	}
	return d, p, dev
}

// TestTensorMapOverPinnedHostMemory: a tensor map whose tensor is pinned
// host memory (XLA's autotuner encodes one) is encoded over the memory's
// mirror, inside the session's allocations. The software GPU encodes no
// maps, so it answers CUDA_ERROR_NOT_SUPPORTED; the host address itself
// would have been refused as outside the session (CUDA_ERROR_INVALID_VALUE).
func TestTensorMapOverPinnedHostMemory(t *testing.T) {
	d, th, _ := driverWithContext(t)
	p := registered(t, d, th, 4096)
	r := abi.TensorMapEncode{DataType: 7 /* FLOAT32 */, Rank: 1, Global: uint64(p), Dims: [abi.MaxTensorRank]uint64{1024},
		Box: [abi.MaxTensorRank]uint32{32}, ElementStrides: [abi.MaxTensorRank]uint32{1}}
	if _, res := d.TensorMapEncodeTiled(th, &r); res != ErrorNotSupported {
		t.Fatalf("encoding a map over pinned host memory: %d, want CUDA_ERROR_NOT_SUPPORTED (%d) from the software GPU", res, ErrorNotSupported)
	}
	if n := d.mapped.count.Load(); n != 1 {
		t.Errorf("%d mirrors after the encode, want the host memory's one", n)
	}
}

// TestMirrorDroppedDuringAWait: a mapped buffer freed by one thread while
// another thread's wait, with the mirrors' reads behind it, is on its way
// keeps its mirror until the reads are done: the wait succeeds, and the
// mirror's device memory is freed after it. (XLA frees its timers' flags
// while other streams wait; the node used to fail such a wait because the
// free overtook the read.)
func TestMirrorDroppedDuringAWait(t *testing.T) {
	d, p, dev := mirrored(t)
	c := d.client
	r := d.waitAndPull(c, "a test's wait", coversAll, func(reads []pvdriver.Read) error {
		if len(reads) != 1 {
			t.Errorf("%d mirror reads behind the wait, want 1", len(reads))
		}
		if r := d.HostUnregister(p); r != Success { // another thread, between the snapshot and the send
			t.Errorf("HostUnregister: %d", r)
		}
		return c.SynchronizeThenRead(reads)
	})
	if r != Success {
		t.Fatalf("the wait: %d, want success", r)
	}
	d.mu.Lock()
	_, kept := d.allocs[dev]
	d.mu.Unlock()
	if kept {
		t.Errorf("the dropped mirror at %#x is still allocated after the wait", dev)
	}
	if n := d.mapped.count.Load(); n != 0 {
		t.Errorf("%d mirrors left, want 0", n)
	}
}

// TestWaitPushesTheProgramsWrites: a byte the program writes into its
// mapped buffer reaches the mirror when it next waits for the device,
// with no device work between (XLA's timer sets a flag its delay kernel
// spins on, then waits for an event).
func TestWaitPushesTheProgramsWrites(t *testing.T) {
	d, p, dev := mirrored(t)
	c := d.client
	var seen [1]byte
	r := d.waitAndPull(c, "a test's wait", coversAll, func(reads []pvdriver.Read) error {
		return c.SynchronizeThenRead(reads)
	})
	if r != Success {
		t.Fatalf("the first wait: %d", r)
	}
	hostBytes(p, 4096)[100] = 1 // the flag
	var pushed bool
	r = d.waitAndPull(c, "a test's wait", coversAll, func(reads []pvdriver.Read) error {
		if err := c.CopyDtoH(seen[:], pvdriver.DevicePtr(dev+100)); err != nil { // what a kernel spinning meanwhile reads
			return err
		}
		pushed = seen[0] == 1
		return c.SynchronizeThenRead(reads)
	})
	if r != Success || !pushed {
		t.Errorf("the wait: %d; the flag on the device while it waited: %d, want 1", r, seen[0])
	}
}
