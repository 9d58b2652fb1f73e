package mmiotrace

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestODirectInFlight: in uffd mode, pages the scan found written stay open —
// compared at every flush — until a flush finds them unchanged; once
// write-protected again they are still compared at every flush while a
// guest thread may still be inside a system call that pinned them (here a thread blocked in read(2) stands
// for an O_DIRECT read in flight, and the test's second mapping for the
// device), however many flushes pass; once the call returned, a flush
// settles them. The guest is this process, which the tracer cannot ptrace,
// so only what /proc says settles it. (The second look this replaces
// compared such a page twice and lost the device's write here.)
func TestODirectInFlight(t *testing.T) {
	skipUnlessTraceable(t, ModeUffd)
	const pages = 2 * settleAbove
	fd, err := unix.MemfdCreate("vgpuha-test-unsettled", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, pages*pageSize); err != nil {
		t.Fatal(err)
	}
	guest, err := unix.Mmap(fd, 0, pages*pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(guest)
	device, err := unix.Mmap(fd, 0, pages*pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(device)
	uffd, err := ArmWriteTracking(guest)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(uffd)
	tr := Attach(os.Getpid(), Options{Mode: ModeUffd})
	defer tr.Close()
	if err := tr.AddRegion(&Region{GuestAddr: addrOf(guest), Mem: device, Kind: KindMemory}); err != nil {
		t.Fatal(err)
	}
	rp := &replica{mem: make([]byte, len(device))}
	flush := func(step string) {
		t.Helper()
		if err := tr.Flush(rp.apply); err != nil {
			t.Fatal(err)
		}
		if string(rp.mem) != string(device) {
			t.Fatalf("%s: replica differs from the memory at %d", step, firstDiff(rp.mem, device))
		}
	}
	flush("first flush")

	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	blocked, returned := make(chan int), make(chan struct{})
	go func() {
		runtime.LockOSThread() // the thread ends with the goroutine: it is in read(2) until then
		blocked <- unix.Gettid()
		var b [1]byte
		unix.Read(p[0], b[:])
		close(returned)
	}()
	tid := <-blocked
	for !inRead(tid) {
		runtime.Gosched()
	}

	for pg := 1; pg <= settleAbove+1; pg++ { // more than settleAbove, so flushes try to settle
		guest[pg*pageSize+8] = 1 // the stores the scan finds (as a read pins the pages)
	}
	flush("the store")
	flush("no change")
	for i := range 3 {
		device[pageSize+100+i] = 0xa0 + byte(i) // the device, flushes after the scan found the page
		flush("a device write while the call is in flight")
		flush("no change")
	}
	// The pages stay open for the store's flush and the next (which finds
	// them quiet); every flush from the one that closes them is unsettled.
	if st := tr.Stats(); st.Unsettled < 6 || st.PtraceAttached {
		t.Fatalf("while a thread is in read(2): %+v, want every flush from the one closing the pages unsettled, no ptrace", st)
	}
	t.Logf("torture case uffd O_DIRECT stand-in: a device write while the read(2) is in flight, many flushes after the scan: 0 mismatched bytes")

	unix.Write(p[1], []byte{1})
	<-returned
	// The other threads of this process wait (futex, epoll) but may be
	// running at a flush now and then: a few tries.
	for try := 0; ; try++ {
		before := tr.Stats().Unsettled
		flush("after the call returned")
		if tr.Stats().Unsettled == before {
			break
		}
		if try == 1000 {
			t.Fatalf("never settled after the call returned: %+v", tr.Stats())
		}
		runtime.Gosched()
	}
	if len(tr.unsettled) != 0 {
		t.Fatalf("settled, yet pages stay open: %v", tr.unsettled)
	}
}

// inRead reports whether thread tid of this process is blocked in read(2).
func inRead(tid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/syscall", tid))
	return err == nil && strings.HasPrefix(string(b), fmt.Sprintf("%d ", unix.SYS_READ))
}
