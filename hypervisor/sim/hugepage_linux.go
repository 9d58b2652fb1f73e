package sim

import (
	"syscall"
	"unsafe"
)

// deviceMemory returns n zeroed bytes of device memory, asking the kernel
// to back it with huge pages: first touch then faults once per 2 MiB
// instead of once per 4 KiB. Measured on this project's 2-core VMs, where
// a fault is costly, writing fresh memory ran at 0.21 GB/s in small pages
// and 0.79 GB/s with the advice; a standby that is being resynced writes
// all of its replica's memory once. The advice covers only the whole huge
// pages inside the slice, so it touches no other Go object; a kernel
// without transparent huge pages ignores it.
func deviceMemory(n uint64) []byte {
	b := make([]byte, n)
	const huge = 2 << 20
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	lo := (start + huge - 1) &^ (huge - 1)
	hi := (start + uintptr(n)) &^ (huge - 1)
	if hi > lo {
		syscall.Madvise(b[lo-start:hi-start], syscall.MADV_HUGEPAGE)
	}
	return b
}

// populate maps b's pages writable without writing them
// (MADV_POPULATE_WRITE, Linux 5.14): concurrent writers are unaffected. An
// older kernel refuses it; the pages are then mapped on first write.
func populate(b []byte) {
	const madvPopulateWrite = 23
	syscall.Madvise(b, madvPopulateWrite)
}
