package sim_test

import (
	"bytes"
	"testing"

	"github.com/vgpuha/vgpuha/hypervisor/sim"
)

// TestCopiesAcrossAllocations: a copy, a memset or a device-to-device copy
// may run from one allocation into the next that starts where it ends
// (mappings that follow one another, CUDA's virtual memory management),
// and is refused across a gap.
func TestCopiesAcrossAllocations(t *testing.T) {
	const base, size = 0x7e0000000000, 1 << 20
	ctx, err := sim.New(64<<20).NewContext(base, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	for _, a := range []uint64{base, base + size, base + 3*size} { // a gap after the second
		if err := ctx.Alloc(a, size); err != nil {
			t.Fatal(err)
		}
	}
	data := make([]byte, 100)
	for i := range data {
		data[i] = byte(i + 1)
	}
	across := uint64(base + size - 50)
	if err := ctx.CopyHtoD(across, data, 0); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	if err := ctx.CopyDtoH(got, across, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back across two allocations: %v %v", err, got)
	}
	if err := ctx.CopyDtoD(base+10, across, uint64(len(data)), 0); err != nil {
		t.Fatal(err)
	}
	if err := ctx.CopyDtoH(got, base+10, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("device copy from across two allocations: %v %v", err, got)
	}
	if err := ctx.Memset(base+size-6, 4, 0x04030201, 4, 0); err != nil { // 6 bytes in the first, 10 in the second
		t.Fatal(err)
	}
	want := []byte{1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4}
	if err := ctx.CopyDtoH(got[:16], base+size-6, 0); err != nil || !bytes.Equal(got[:16], want) {
		t.Fatalf("memset across two allocations: %v %v", err, got[:16])
	}
	if err := ctx.CopyHtoD(base+2*size-50, data, 0); err == nil {
		t.Fatal("a copy into the gap after an allocation was accepted")
	}
}
