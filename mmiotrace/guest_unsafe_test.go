package mmiotrace

import (
	"sync"
	"sync/atomic"
	"unsafe"
)

// guestWorkload writes mem in one of a few patterns. The expected write
// sequence of "seq" is known to the test (expectSeq).
func guestWorkload(name string, mem []byte) {
	p := unsafe.Pointer(&mem[0])
	switch name {
	case "seq": // 8-byte stores of known values
		for i := 0; i < 64; i++ {
			*(*uint64)(unsafe.Add(p, 8*i)) = uint64(i)*0x0101010101010101 + 1
		}
	case "widths": // 1-, 2-, 4-byte stores and a store straddling pages
		*(*uint8)(unsafe.Add(p, 1000)) = 0xab
		*(*uint16)(unsafe.Add(p, 1002)) = 0xbeef
		*(*uint32)(unsafe.Add(p, 1004)) = 0xdeadbeef
		*(*uint64)(unsafe.Add(p, pageSize-4)) = 0x1122334455667788
	case "atomics": // XCHG (atomic store), LOCK XADD, LOCK CMPXCHG
		u := (*uint64)(unsafe.Add(p, 2*pageSize))
		atomic.StoreUint64(u, 40)
		atomic.AddUint64(u, 2)
		atomic.CompareAndSwapUint64((*uint64)(unsafe.Add(p, 2*pageSize+8)), 0, 7)
	case "copy": // memmove: vector stores
		src := make([]byte, 3*pageSize)
		for i := range src {
			src[i] = byte(i * 7)
		}
		copy(mem[4*pageSize+16:], src)
	case "goroutines": // several goroutines (and threads) writing their own pages
		var wg sync.WaitGroup
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				base := unsafe.Add(p, (8+g*2)*pageSize)
				for i := 0; i < 300; i++ {
					*(*uint64)(unsafe.Add(base, 8*(i%512))) = uint64(g<<32 | i)
				}
			}()
		}
		wg.Wait()
	}
}
