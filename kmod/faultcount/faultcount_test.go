package faultcount

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestFaultCounter touches fresh anonymous pages: each first write is one
// write fault in the counted range, and a fault outside it is not counted.
func TestFaultCounter(t *testing.T) {
	if testing.Short() {
		t.Skip("kernel test: loads an eBPF program (root; may mount tracefs)")
	}
	const pages = 64
	mem, err := unix.Mmap(-1, 0, 2*pages*4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	lo := addrOf(mem)
	fc, err := NewFaultCounter(os.Getpid(), lo, lo+pages*4096)
	if err != nil {
		t.Skipf("eBPF unavailable here: %v", err)
	}
	defer fc.Close()
	for i := 0; i < 2*pages; i++ { // the second half lies outside the range
		mem[i*4096] = 1
	}
	reads, writes, err := fc.Counts()
	if err != nil {
		t.Fatal(err)
	}
	if writes != pages || reads != 0 {
		t.Fatalf("counted %d write and %d read faults, want %d and 0", writes, reads, pages)
	}
}
