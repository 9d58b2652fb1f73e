//go:build linux

package kmod

import (
	"bytes"
	"errors"
	"math/rand"
	"os"
	"runtime/debug"
	"slices"
	"testing"
	"time"

	"golang.org/x/arch/x86/x86asm"
	"golang.org/x/sys/unix"

	"github.com/vgpuha/vgpuha/kmod/faultcount"
)

// The TestInVM tests run inside the VM that TestModuleInVM boots, with the
// module loaded; elsewhere they skip.

func inVM(t *testing.T) *Device {
	t.Helper()
	if os.Getenv("VGPUHA_KMOD_HOSTILE") == "" {
		t.Skip("runs inside the VM that TestModuleInVM boots")
	}
	d, err := Open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func newAperture(t *testing.T, d *Device, pages, mode int) (Aperture, []byte, []byte) {
	t.Helper()
	a, err := d.Create(0, uint64(pages)*4096, mode, -1)
	if err != nil {
		t.Fatal(err)
	}
	g := mapGuest(t, a)
	tr, err := d.MapTracer(a)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(tr) })
	return a, g, tr
}

// mapGuest maps aperture a into this process, its guest, until the test ends.
func mapGuest(t *testing.T, a Aperture) []byte {
	t.Helper()
	g, err := MapGuest(a)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(g) })
	return g
}

type wantStore struct {
	off   uint64
	value []byte
}

// TestInVMStoreSequence: in per-write mode the events are the program's
// stores, in order, each with its address, width (decoded from the
// instruction bytes) and value; the tracer's view equals the guest's.
func TestInVMStoreSequence(t *testing.T) {
	d := inVM(t)
	const pages, n = 4, 2000
	a, g, tr := newAperture(t, d, pages, ModeWrite)
	before, _ := d.Stats()
	rng := rand.New(rand.NewSource(1))
	var want []wantStore
	for i := 0; i < n; i++ {
		width := []int{1, 2, 4, 8}[rng.Intn(4)]
		off := rng.Intn(pages*4096/width) * width
		v := rng.Uint64()
		store(g, off, width, v)
		b := make([]byte, 8)
		for j := range b {
			b[j] = byte(v >> (8 * j))
		}
		want = append(want, wantStore{uint64(off), b[:width]})
	}
	evs, err := d.ReadEvents(nil, make([]byte, 64*EventSize))
	if err != nil {
		t.Fatal(err)
	}
	after, _ := d.Stats()
	if len(evs) != n {
		t.Errorf("%d events for %d stores (stats before %+v after %+v)", len(evs), n, before, after)
	}
	for i, e := range evs[:min(len(evs), n)] {
		inst, err := x86asm.Decode(e.Insn, 64)
		if err != nil {
			t.Fatalf("event %d: decoding % x: %v", i, e.Insn, err)
		}
		w := want[i]
		if e.Type != EventStore || e.ID != a.ID || e.Off != w.off || inst.MemBytes != len(w.value) || !bytes.Equal(e.Data[:inst.MemBytes], w.value) {
			t.Fatalf("event %d: type %d off %#x ip %#x %v data % x, want off %#x value % x; previous %+v", i, e.Type, e.Off, e.IP, inst, e.Data[:8], w.off, w.value, evs[max(i-1, 0)])
		}
	}
	if !bytes.Equal(g, tr) {
		t.Fatal("the tracer's view differs from the guest's")
	}
	// A store a signal handler moved the thread away from faults again
	// when it runs (its first trap is counted unfinished, its page compared).
	if got, moved := after.Faults-before.Faults, after.Unfinished-before.Unfinished; got != n+moved {
		t.Errorf("module counted %d faults for %d stores (%d moved by a signal)", got, n, moved)
	}
	t.Logf("%d stores, %d events in order; module: %+v", n, len(evs), after)
}

// TestInVMPageMode: the first store to a page after a flush opens it; the
// flush lists exactly the pages stored to and takes them away again.
func TestInVMPageMode(t *testing.T) {
	d := inVM(t)
	a, g, tr := newAperture(t, d, 16, ModePage)
	for _, pg := range []int{1, 3, 5, 3} {
		store(g, pg*4096+8, 8, uint64(pg))
	}
	for i, want := range [][]uint64{{1, 3, 5}, nil} {
		got, err := d.Flush(a)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("flush %d: open pages %v, want %v", i, got, want)
		}
	}
	store(g, 3*4096, 1, 9)
	store(g, 15*4096+4095, 1, 9)
	if got, _ := d.Flush(a); !slices.Equal(got, []uint64{3, 15}) {
		t.Fatalf("after stores to pages 3 and 15: open pages %v", got)
	}
	if !bytes.Equal(g, tr) {
		t.Fatal("the tracer's view differs from the guest's")
	}
}

// TestInVMRefusals: only the guest an aperture was created for maps it,
// once; only its tracer maps the tracer's view; a system call cannot
// store into a per-write aperture; a detached aperture refuses stores;
// the module cannot be unloaded while anything is mapped.
func TestInVMRefusals(t *testing.T) {
	d := inVM(t)
	a, g, _ := newAperture(t, d, 2, ModeWrite)
	if _, err := MapGuest(a); !errors.Is(err, unix.EBUSY) {
		t.Errorf("second guest mapping: %v, want EBUSY", err)
	}
	other, err := d.Create(1, 4096, ModeWrite, -1) // for init, not us
	if err != nil {
		t.Fatal(err)
	}
	if _, err := MapGuest(other); !errors.Is(err, unix.EACCES) {
		t.Errorf("mapping another process's aperture: %v, want EACCES", err)
	}
	d2, err := Open()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d2.MapTracer(a); !errors.Is(err, unix.EACCES) {
		t.Errorf("tracer view from another file: %v, want EACCES", err)
	}
	if err := d2.Destroy(a.ID); !errors.Is(err, unix.ENOENT) {
		t.Errorf("destroying another file's aperture: %v, want ENOENT", err)
	}
	d2.Close()
	for _, c := range []struct {
		size uint64
		mode int
	}{{0, ModeWrite}, {100, ModeWrite}, {4096, 7}, {1 << 40, ModePage}} {
		if _, err := d.Create(0, c.size, c.mode, -1); !errors.Is(err, unix.EINVAL) {
			t.Errorf("create size %d mode %d: %v, want EINVAL", c.size, c.mode, err)
		}
	}
	if err := unix.Munmap(g[4096:]); !errors.Is(err, unix.EINVAL) {
		t.Errorf("unmapping half the aperture: %v, want EINVAL", err)
	}
	p := make([]int, 2)
	unix.Pipe(p)
	unix.Write(p[1], []byte("12345678"))
	if _, err := unix.Read(p[0], g[:8]); !errors.Is(err, unix.EFAULT) {
		t.Errorf("read(2) into a per-write aperture: %v, want EFAULT", err)
	}
	unix.Close(p[0])
	unix.Close(p[1])
	if err := unix.DeleteModule("vgpuha_mmio", unix.O_NONBLOCK); err == nil {
		t.Fatal("the module unloaded with an aperture mapped")
	}
	if err := d.Destroy(a.ID); err != nil {
		t.Fatal(err)
	}
	if !storeFaults(g, 16) {
		t.Error("a store to a destroyed aperture went through")
	}
	d.ReadEvents(nil, make([]byte, 64*EventSize))
}

// storeFaults reports whether a store at b[off] raised a memory fault.
func storeFaults(b []byte, off int) (faulted bool) {
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	defer func() { faulted = recover() != nil }()
	store(b, off, 8, 1)
	return false
}

// TestInVMFaultCounter: the eBPF counter (the kernel's page_fault_user
// tracepoint) and the module count the same write faults.
func TestInVMFaultCounter(t *testing.T) {
	d := inVM(t)
	for _, mode := range []int{ModeWrite, ModePage} {
		_, g, _ := newAperture(t, d, 8, mode)
		lo := addrOf(g)
		fc, err := faultcount.NewFaultCounter(os.Getpid(), lo, lo+uint64(len(g)))
		if err != nil {
			t.Fatal(err)
		}
		before, _ := d.Stats()
		for i := 0; i < 1000; i++ {
			store(g, (i*520)%len(g), 8, uint64(i))
		}
		after, _ := d.Stats()
		_, writes, err := fc.Counts()
		fc.Close()
		if err != nil {
			t.Fatal(err)
		}
		mod := after.Faults - before.Faults
		t.Logf("mode %d: eBPF counted %d write faults, the module %d", mode, writes, mod)
		if writes != mod {
			t.Errorf("mode %d: eBPF counted %d write faults, the module %d", mode, writes, mod)
		}
		d.ReadEvents(nil, make([]byte, 64*EventSize))
	}
}

// TestInVMNoLeaks: once every file is closed the module holds nothing.
func TestInVMNoLeaks(t *testing.T) {
	d := inVM(t)
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, err := d.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if s.Apertures == 0 && s.Mappings == 0 && s.Pending == 0 && s.Pages == 0 && s.Files == 1 {
			t.Logf("module counters: %+v", s)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("left behind: %+v", s)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestInVMOverTracerMapping: an aperture over the tracer's own shared
// mapping (a memfd, as the hypervisor holds a guest's aperture file): the
// guest's stores land in the tracer's memory.
func TestInVMOverTracerMapping(t *testing.T) {
	d := inVM(t)
	mem := memfdMapping(t, 2)
	mem[100] = 7
	_, g := apertureOver(t, d, mem)
	if g[100] != 7 {
		t.Fatalf("the guest sees %d where the tracer wrote 7", g[100])
	}
	store(g, 4096+8, 8, 0x1122334455667788)
	if !bytes.Equal(g, mem) {
		t.Fatal("the tracer's mapping differs from the guest's")
	}
	evs, _ := d.ReadEvents(nil, make([]byte, 4*EventSize))
	if len(evs) != 1 || evs[0].Off != 4096+8 {
		t.Fatalf("events %+v, want one store at %#x", evs, 4096+8)
	}
}

// TestInVMAuto: in auto mode a page stored to in a streak is tracked per
// page once past the module's auto_streak (4), until the next flush; a
// page stored to once per flush stays per write.
func TestInVMAuto(t *testing.T) {
	d := inVM(t)
	a, g, tr := newAperture(t, d, 4, ModeAuto)
	before, _ := d.Stats()
	for round := 0; round < 3; round++ {
		for i := 0; i < 100; i++ {
			store(g, 8*i, 8, uint64(round*1000+i)) // page 0: a streak
		}
		store(g, 4096+8*round, 8, uint64(round)) // page 1: a doorbell
		after, _ := d.Stats()
		evs, err := d.ReadEvents(nil, make([]byte, 64*EventSize))
		if err != nil {
			t.Fatal(err)
		}
		open, err := d.Flush(a)
		if err != nil {
			t.Fatal(err)
		}
		var page0, page1 int
		for _, e := range evs {
			if e.Off < 4096 {
				page0++
			} else {
				page1++
			}
		}
		// A store a signal handler moved the thread off takes a fault of
		// the streak but leaves no event (its page is compared instead).
		moved := int(after.Unfinished - before.Unfinished)
		if page0 < 4-moved || page0 > 4 || page1 != 1 || !slices.Contains(open, 0) || slices.Contains(open, 1) && moved == 0 {
			t.Fatalf("round %d: %d events on the streak page, %d on the doorbell page, open pages %v (%d moved); want 4, 1, [0]", round, page0, page1, open, moved)
		}
		before = after
	}
	if !bytes.Equal(g, tr) {
		t.Fatal("the tracer's view differs from the guest's")
	}
}
