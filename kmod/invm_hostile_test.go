//go:build linux

package kmod

import (
	"math/rand"
	"os"
	"os/exec"
	"runtime/debug"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestInVMHostile throws random ioctls, mmaps, stores, reads, flushes and
// early closes at the device from several goroutines and from child
// processes killed mid-trace, for VGPUHA_KMOD_HOSTILE. What it checks
// comes after it: TestInVMNoLeaks (the module's counters at zero) and the
// VM script (slab caches empty, rmmod, dmesg clean).
func TestInVMHostile(t *testing.T) {
	inVM(t).Close()
	d, err := time.ParseDuration(os.Getenv("VGPUHA_KMOD_HOSTILE"))
	if err != nil {
		t.Fatal(err)
	}
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	var ops [4]int
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			h := &hostile{rng: rand.New(rand.NewSource(int64(w)))}
			defer h.closeAll()
			for time.Now().Before(end) {
				h.step()
				ops[w]++
			}
		}(w)
	}
	wg.Add(1)
	go func() { // children killed mid-trace
		defer wg.Done()
		rng := rand.New(rand.NewSource(99))
		for time.Now().Before(end) {
			cmd := exec.Command(os.Args[0], "-test.run", "^TestInVMHostileChild$")
			cmd.Env = append(os.Environ(), "VGPUHA_KMOD_CHILD=1")
			if err := cmd.Start(); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(time.Duration(rng.Intn(300)) * time.Millisecond)
			cmd.Process.Signal(syscall.SIGKILL)
			cmd.Wait()
		}
	}()
	wg.Wait()
	t.Logf("operations per worker: %v", ops)
}

// TestInVMHostileChild is the child TestInVMHostile kills: it traces its
// own stores until it is killed.
func TestInVMHostileChild(t *testing.T) {
	if os.Getenv("VGPUHA_KMOD_CHILD") == "" {
		t.Skip("a child of TestInVMHostile")
	}
	h := &hostile{rng: rand.New(rand.NewSource(int64(os.Getpid())))}
	for {
		h.step()
	}
}

type hostile struct {
	rng   *rand.Rand
	files []*Device
	aps   []Aperture
	maps  [][]byte
	guest [][]byte
}

func (h *hostile) file() *Device {
	if len(h.files) == 0 {
		return nil
	}
	return h.files[h.rng.Intn(len(h.files))]
}

// step does one random thing; errors are the point, not failures.
func (h *hostile) step() {
	r := h.rng
	d := h.file()
	switch op := r.Intn(12); {
	case op == 0 || d == nil:
		if len(h.files) < 6 {
			if f, err := Open(); err == nil {
				h.files = append(h.files, f)
			}
		}
	case op == 1:
		pid := []int{0, 0, os.Getpid(), 1, r.Intn(1 << 20), -r.Intn(5)}[r.Intn(6)]
		size := []uint64{4096, 8192, uint64(r.Intn(64)) * 4096, uint64(r.Intn(1 << 16)), 1 << 40}[r.Intn(5)]
		memfd := -1
		if r.Intn(3) == 0 {
			memfd, _ = unix.MemfdCreate("hostile", 0)
			unix.Ftruncate(memfd, int64(r.Intn(16))*4096)
		}
		if a, err := d.Create(pid, size, r.Intn(4), memfd); err == nil {
			h.aps = append(h.aps, a)
			if memfd >= 0 && r.Intn(2) == 0 { // a mapping of its file, to adopt it over
				if m, err := unix.Mmap(memfd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err == nil {
					h.maps = append(h.maps, m)
				}
			}
		}
		if memfd >= 0 {
			unix.Close(memfd)
		}
	case op == 2 && len(h.aps) > 0:
		a := h.aps[r.Intn(len(h.aps))]
		size := int(a.Size)
		if r.Intn(4) == 0 {
			size = r.Intn(1<<16) + 1
		}
		flags := []int{unix.MAP_SHARED, unix.MAP_PRIVATE}[r.Intn(2)]
		off := []uint64{a.GuestOff, a.TracerOff, uint64(r.Int63())}[r.Intn(3)] &^ 4095
		if m, err := unix.Mmap(d.Fd(), int64(off), size, unix.PROT_READ|unix.PROT_WRITE, flags); err == nil {
			if off == a.GuestOff {
				h.guest = append(h.guest, m)
			} else {
				h.maps = append(h.maps, m)
			}
		}
	case op == 3 || op == 4:
		ms := append(h.guest, h.maps...)
		if len(ms) > 0 {
			m := ms[r.Intn(len(ms))]
			for i := 0; i < r.Intn(50); i++ {
				storeMayFault(m, r.Intn(len(m)-7)&^7, r.Uint64())
			}
		}
	case op == 5:
		buf := make([]byte, r.Intn(1024))
		if len(h.guest) > 0 && r.Intn(2) == 0 {
			buf = h.guest[r.Intn(len(h.guest))]
		}
		unix.Read(d.Fd(), buf)
	case op == 6 && len(h.aps) > 0 && r.Intn(3) == 0:
		h.adopt()
	case op == 6 && len(h.aps) > 0:
		a := h.aps[r.Intn(len(h.aps))]
		if r.Intn(2) == 0 {
			a.Size = uint64(r.Intn(1<<20)) * 4096
		}
		d.Flush(a)
	case op == 7:
		f := vgFlush{ID: uint32(r.Intn(8)), NPages: r.Uint32(), Bitmap: r.Uint64()}
		ioctlPtr(d.Fd(), iocFlush, &f)
	case op == 8:
		var junk [128]byte
		r.Read(junk[:])
		ioctlPtr(d.Fd(), uintptr(r.Uint32()), &junk)
		ioctlPtr(d.Fd(), []uintptr{iocCreate, iocDestroy, iocFlush, iocStats, iocAdopt}[r.Intn(5)], &junk)
	case op == 9 && len(h.aps) > 0:
		i := r.Intn(len(h.aps))
		d.Destroy(h.aps[i].ID)
		h.aps = append(h.aps[:i], h.aps[i+1:]...)
	case op == 10:
		h.unmapSome()
	case op == 11 && r.Intn(4) == 0:
		i := r.Intn(len(h.files))
		h.files[i].Close()
		h.files = append(h.files[:i], h.files[i+1:]...)
	}
}

// adopt tries to take over one of the apertures (orphaned or not, over
// some mapping or other, for some process or other).
func (h *hostile) adopt() {
	r := h.rng
	a := h.aps[r.Intn(len(h.aps))]
	ms := append(h.guest, h.maps...)
	var mem []byte
	if len(ms) > 0 {
		mem = ms[r.Intn(len(ms))]
	}
	if len(mem) > 4096 && r.Intn(4) == 0 {
		mem = mem[:len(mem)-4096]
	}
	pid := []int{os.Getpid(), 1, 0, r.Intn(1 << 20)}[r.Intn(4)]
	if b, _, err := h.file().Adopt(a.ID, pid, mem, r.Intn(5)); err == nil {
		h.aps = append(h.aps, b)
	}
}

func (h *hostile) unmapSome() {
	r := h.rng
	if len(h.guest) > 0 && r.Intn(2) == 0 {
		i := r.Intn(len(h.guest))
		unix.Munmap(h.guest[i])
		h.guest = append(h.guest[:i], h.guest[i+1:]...)
	} else if len(h.maps) > 0 {
		i := r.Intn(len(h.maps))
		unix.Munmap(h.maps[i])
		h.maps = append(h.maps[:i], h.maps[i+1:]...)
	}
}

func (h *hostile) closeAll() {
	for _, m := range append(h.guest, h.maps...) {
		unix.Munmap(m)
	}
	for _, f := range h.files {
		f.Close()
	}
}

// storeMayFault stores, surviving a refused store (SIGBUS).
func storeMayFault(b []byte, off int, v uint64) {
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	defer func() { recover() }()
	store(b, off, 8, v)
}
