//go:build linux

package kmod

import (
	"errors"
	"os"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// TestInVMAdopt: a tracer that closes its file leaves an aperture over a
// file to the guest (its stores go on into the file, pages marked open);
// another tracer that maps the same file adopts it (only then, and only
// for the guest it was made for), its first flush lists the pages stored
// meanwhile, and stores are traced again. An aperture on the module's
// own pages is refused instead once its tracer is gone.
func TestInVMAdopt(t *testing.T) {
	d := inVM(t)
	mem, other := memfdMapping(t, 2), memfdMapping(t, 2)
	d1, err := Open()
	if err != nil {
		t.Fatal(err)
	}
	a, g := apertureOver(t, d1, mem)
	store(g, 8, 8, 1)
	if _, _, err := d.Adopt(a.ID, os.Getpid(), mem, ModeWrite); !errors.Is(err, unix.EBUSY) {
		t.Errorf("adopting a traced aperture: %v, want EBUSY", err)
	}
	before, _ := d.Stats()
	d1.Close()
	store(g, 4096+16, 8, 0x55) // no tracer: goes through, page 1 marked open
	after, _ := d.Stats()
	if mem[4096+16] != 0x55 || after.OrphanStores != before.OrphanStores+1 {
		t.Fatalf("a store to an orphaned aperture: file byte %#x, orphan stores %d -> %d", mem[4096+16], before.OrphanStores, after.OrphanStores)
	}
	for _, c := range []struct {
		pid  int
		mem  []byte
		want error
	}{{1, mem, unix.EACCES}, {os.Getpid(), other, unix.EINVAL}, {os.Getpid(), mem[:4096], unix.EINVAL}, {-1, mem, unix.EINVAL}} {
		if _, _, err := d.Adopt(a.ID, c.pid, c.mem, ModeWrite); !errors.Is(err, c.want) {
			t.Errorf("adopt as pid %d over %d bytes: %v, want %v", c.pid, len(c.mem), err, c.want)
		}
	}
	b, at, err := d.Adopt(a.ID, os.Getpid(), mem, ModeAuto)
	if err != nil || at != addrOf(g) {
		t.Fatalf("adopt: %v, guest at %#x, want %#x", err, at, addrOf(g))
	}
	// (Page 0 too where a signal moved the thread off its traced store.)
	if open, err := d.Flush(b); err != nil || !slices.Contains(open, 1) || len(open) > 2 {
		t.Fatalf("the adopter's first flush: %v, %v; want page 1 (stored while orphaned)", open, err)
	}
	s0, _ := d.Stats()
	for i := 0; i < 10; i++ { // auto mode, adopted from per-write: a streak on page 0
		store(g, 8*i, 8, uint64(i))
	}
	s1, _ := d.Stats()
	evs, _ := d.ReadEvents(nil, make([]byte, 64*EventSize))
	// A store a signal handler moved the thread off leaves no event (see TestInVMAuto).
	if s1.Streaks != s0.Streaks+1 || len(evs)+int(s1.Unfinished-s0.Unfinished) < 4 {
		t.Fatalf("stores after the adoption: %d events, streaks %d -> %d", len(evs), s0.Streaks, s1.Streaks)
	}
	if _, _, err := d.Adopt(a.ID, os.Getpid(), mem, ModeWrite); !errors.Is(err, unix.EBUSY) {
		t.Errorf("adopting twice: %v, want EBUSY", err)
	}
	// Page 0 is open (the streak): destroying takes it away all the same.
	if err := d.Destroy(b.ID); err != nil || !storeFaults(g, 16) {
		t.Errorf("destroying the adopted aperture: %v; a store after it, to an open page, must fault", err)
	}
	d3, err := Open()
	if err != nil {
		t.Fatal(err)
	}
	own, err := d3.Create(0, 4096, ModeWrite, -1)
	if err != nil {
		t.Fatal(err)
	}
	g3 := mapGuest(t, own) // no tracer view: a mapping of it would keep d3's file open
	d3.Close()
	if !storeFaults(g3, 0) {
		t.Error("a store to an aperture on the module's pages went through after its tracer closed")
	}
}

// apertureOver creates a per-write aperture over mem for this process
// and maps it (unmapped at the test's end).
func apertureOver(t *testing.T, d *Device, mem []byte) (Aperture, []byte) {
	t.Helper()
	a, err := d.CreateOver(0, mem, ModeWrite)
	if err != nil {
		t.Fatal(err)
	}
	return a, mapGuest(t, a)
}

// memfdMapping is a shared mapping of a new memfd of pages pages.
func memfdMapping(t *testing.T, pages int) []byte {
	t.Helper()
	fd, err := unix.MemfdCreate("aperture", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, int64(pages)*4096); err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(fd, 0, pages*4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(m) })
	return m
}
