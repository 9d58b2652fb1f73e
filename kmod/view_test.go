//go:build linux

package kmod

import "testing"

// TestGuestView: the guest's view of an aperture is named by its mmap
// offset (module: id << (VG_VIEW_SHIFT+1) pages); the tracer's view and
// offsets inside a view name none.
func TestGuestView(t *testing.T) {
	for _, c := range []struct {
		off uint64
		id  uint32
		ok  bool
	}{
		{1 << 33, 1, true},         // id 1: 1<<21 pages
		{77 << 33, 77, true},       // id 77
		{77<<33 | 1<<32, 0, false}, // id 77's tracer view
		{77<<33 | 4096, 0, false},  // inside a view
		{0, 0, false},              // id 0 is never allocated
		{1<<53 | 5<<33, 0, false},  // beyond the module's ids
		{77<<33 | 12, 0, false},    // not a page
	} {
		id, ok := GuestView(c.off)
		if id != c.id || ok != c.ok {
			t.Errorf("GuestView(%#x) = %d, %v; want %d, %v", c.off, id, ok, c.id, c.ok)
		}
	}
}
