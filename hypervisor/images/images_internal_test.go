package images

import (
	"testing"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
)

func testImage(t *testing.T, name string) ([]byte, *abi.ModuleImage) {
	t.Helper()
	raw := (&abi.ModuleImage{Kernels: []abi.KernelSpec{{Name: name}}}).Append(nil)
	img, err := abi.DecodeModuleImage(raw)
	if err != nil {
		t.Fatal(err)
	}
	return raw, img
}

// TestImageCacheTenants: a hit needs the tenant to have sent the image; the
// least recently used image leaves first once the bound is passed.
func TestImageCacheTenants(t *testing.T) {
	rawA, a := testImage(t, "a")
	rawB, b := testImage(t, "b")
	c := New(int64(len(rawA) + len(rawB)))
	ha, hb := abi.HashImage(rawA), abi.HashImage(rawB)
	c.Put(ha, a, int64(len(rawA)), "uid:1")
	if img, _ := c.Get(ha, "uid:2"); img != nil {
		t.Fatal("another tenant loaded uid:1's image by its hash")
	}
	if img, _ := c.Get(ha, "uid:1"); img != a {
		t.Fatal("the tenant that sent the image cannot load it by hash")
	}
	c.Put(hb, b, int64(len(rawB)), "uid:1")
	c.Get(ha, "uid:1") // a is now the most recent
	rawC, cimg := testImage(t, "c")
	c.Put(abi.HashImage(rawC), cimg, int64(len(rawC)), "uid:1")
	if img, _ := c.Get(hb, "uid:1"); img != nil {
		t.Error("the least recently used image stayed past the bound")
	}
	if img, _ := c.Get(ha, "uid:1"); img != a {
		t.Error("a recently used image left before the least recently used one")
	}
	if st := c.Status(); st.CachedBytes > c.limit {
		t.Errorf("cache holds %d bytes, bound %d", st.CachedBytes, c.limit)
	}
}

// TestImageShipping: an image goes into the log once until a resync, and a
// standby keeps what the log carried until its reset.
func TestImageShipping(t *testing.T) {
	raw, img := testImage(t, "k")
	h := abi.HashImage(raw)
	primary, standby := New(1<<20), New(1<<20)
	log := replicate.NewLog(1 << 20)
	for range 3 {
		if !primary.Ship(h, img, log) {
			t.Fatal("ship refused within its budget")
		}
	}
	if n := log.Last(); n != 1 {
		t.Fatalf("%d records after shipping one image three times, want 1", n)
	}
	if err := standby.Receive(raw); err != nil {
		t.Fatal(err)
	}
	if standby.Received(h) == nil {
		t.Fatal("the standby lost a carried image")
	}
	primary.ResetShipped()
	primary.Ship(h, img, log)
	if n := log.Last(); n != 2 {
		t.Errorf("after a resync the image was not carried again (%d records)", n)
	}
	standby.ResetReceived()
	if standby.Received(h) != nil {
		t.Error("a reset standby still holds a carried image")
	}
	if err := standby.Receive([]byte("not an image")); err == nil {
		t.Error("a malformed image record was kept")
	}
}
