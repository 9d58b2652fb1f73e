package images

import (
	"fmt"
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

// put caches the image called name for tenant and returns its hash.
func put(t *testing.T, c *Cache, name, tenant string) abi.ImageHash {
	t.Helper()
	raw, img := testImage(t, name)
	h := abi.HashImage(raw)
	c.Put(h, img, int64(len(raw)), tenant)
	return h
}

// has reports whether tenant gets the image called name from the cache.
func has(t *testing.T, c *Cache, name, tenant string) bool {
	t.Helper()
	raw, _ := testImage(t, name)
	img, _ := c.Get(abi.HashImage(raw), tenant)
	return img != nil
}

// TestImageCacheTenants: a hit needs the tenant to have sent the image; the
// least recently used image leaves first once the share's bound is passed.
func TestImageCacheTenants(t *testing.T) {
	rawA, _ := testImage(t, "a")
	rawB, _ := testImage(t, "b")
	c := New(Config{Limit: int64(len(rawA) + len(rawB))})
	ha := put(t, c, "a", "uid:1")
	if img, _ := c.Get(ha, "uid:2"); img != nil {
		t.Fatal("another tenant loaded uid:1's image by its hash")
	}
	if img, size := c.Get(ha, "uid:1"); img == nil || size != int64(len(rawA)) {
		t.Fatal("the tenant that sent the image cannot load it by hash")
	}
	put(t, c, "b", "uid:1")
	c.Get(ha, "uid:1") // a is now the most recent
	put(t, c, "c", "uid:1")
	if has(t, c, "b", "uid:1") {
		t.Error("the least recently used image stayed past the bound")
	}
	if !has(t, c, "a", "uid:1") {
		t.Error("a recently used image left before the least recently used one")
	}
	if st := c.Status(); st.CachedBytes > c.share || st.Tenants != 1 || st.Shares != 1 {
		t.Errorf("cache %+v, bound %d", st, c.share)
	}
}

// cacheSizes are the bounds the probes run under, from one image's share
// (and a cache of two shares) to roomy ones: the probe used 32 KiB.
func cacheSizes(t *testing.T) []Config {
	raw, _ := testImage(t, "k00")
	one := int64(len(raw))
	return []Config{{Limit: 2 * one, Share: one}, {Limit: 4 * one, Share: 2 * one}, {Limit: 32 << 10, Share: 16 << 10}, {Limit: 32 << 10}, {Limit: 1 << 30, Share: 256 << 20}}
}

// TestNoCrossTenantEviction: tenant A filling its share, again and again,
// never evicts an image of tenant B's, at any cache size.
func TestNoCrossTenantEviction(t *testing.T) {
	for _, cfg := range cacheSizes(t) {
		c := New(cfg)
		c.Opened("uid:2") // B, first: with one share of it all, B's
		c.Opened("uid:1")
		put(t, c, "b", "uid:2")
		for i := range 2000 {
			put(t, c, fmt.Sprintf("k%02d", i%97), "uid:1")
			put(t, c, "b", "uid:1") // the same image as B's
		}
		if !has(t, c, "b", "uid:2") {
			t.Errorf("%+v: tenant A's images evicted tenant B's", cfg)
		}
	}
}

// probe is what tenant A can observe of the cache after a fixed sequence
// of its own loads, with or without tenant B having loaded image "x":
// which of A's images it still gets, whether it gets "x" itself, and
// whether its loads by hash add records to the log.
func probe(t *testing.T, cfg Config, bLoadedX bool) string {
	c := New(cfg)
	log := replicate.NewLog(1 << 20)
	c.Opened("uid:1")
	c.Opened("uid:2")
	if bLoadedX {
		hx := put(t, c, "x", "uid:2")
		if img, _ := c.Get(hx, "uid:2"); img != nil {
			c.Ship(hx, img, "uid:2", log) // B loaded it by hash: the log carried it
		}
	}
	before := log.Last()
	seen := fmt.Sprintf("x before A sent it: %v;", has(t, c, "x", "uid:1"))
	for i := range 6 {
		put(t, c, fmt.Sprintf("k%02d", i), "uid:1")
	}
	hx := put(t, c, "x", "uid:1") // A sends x itself, then loads it by hash
	if img, _ := c.Get(hx, "uid:1"); img != nil {
		seen += fmt.Sprintf(" shipped %v, records %d;", c.Ship(hx, img, "uid:1", log), log.Last()-before)
	}
	for i := range 6 {
		seen += fmt.Sprintf(" k%02d %v", i, has(t, c, fmt.Sprintf("k%02d", i), "uid:1"))
	}
	return seen + fmt.Sprintf(" x %v", has(t, c, "x", "uid:1"))
}

// TestNoCrossTenantMembership: whatever tenant A does, it sees the same
// whether tenant B loaded an image or nobody did (the cache never serves
// it B's entry, its evictions and the log's records for it are the same),
// at any cache size.
func TestNoCrossTenantMembership(t *testing.T) {
	for _, cfg := range cacheSizes(t) {
		with, without := probe(t, cfg, true), probe(t, cfg, false)
		if with != without {
			t.Errorf("%+v: tenant A tells whether B loaded the image:\n B loaded it: %s\n nobody did:  %s", cfg, with, without)
		}
	}
}

// TestSharesOutliveSessions: a tenant's share outlives its sessions (its
// next process finds its images); once every share is taken a new tenant
// caches nothing while the holders have sessions, and then takes the share
// of the tenant that left longest ago, never one whose tenant has a
// session.
func TestSharesOutliveSessions(t *testing.T) {
	raw, _ := testImage(t, "k00")
	c := New(Config{Limit: 4 * int64(len(raw)), Share: 2 * int64(len(raw))})
	for _, tenant := range []string{"uid:1", "uid:2", "uid:3"} {
		c.Opened(tenant)
	}
	put(t, c, "a", "uid:1")
	put(t, c, "b", "uid:2")
	put(t, c, "c", "uid:3")
	if has(t, c, "c", "uid:3") || !has(t, c, "a", "uid:1") || !has(t, c, "b", "uid:2") {
		t.Fatal("a third tenant took a share from two with sessions")
	}
	c.Closed("uid:1")
	c.Opened("uid:1")
	c.Closed("uid:1")
	if !has(t, c, "a", "uid:1") {
		t.Fatal("a tenant's images left with its last session")
	}
	c.Closed("uid:2")
	put(t, c, "c", "uid:3")
	if !has(t, c, "c", "uid:3") || has(t, c, "a", "uid:1") || !has(t, c, "b", "uid:2") {
		t.Error("the new tenant did not take the share of the tenant that left longest ago")
	}
	c.Opened("uid:2")
	put(t, c, "a", "uid:1")
	if has(t, c, "a", "uid:1") || !has(t, c, "b", "uid:2") || !has(t, c, "c", "uid:3") {
		t.Error("a returning tenant took a share from tenants with sessions")
	}
	if st := c.Status(); st.Tenants != 2 || st.Shares != 2 || st.Cached != 2 {
		t.Errorf("status %+v", st)
	}
}

// TestImageShipping: an image goes into the log once per tenant until a
// resync, and a standby keeps one copy of what the log carried until its
// reset.
func TestImageShipping(t *testing.T) {
	raw, img := testImage(t, "k")
	h := abi.HashImage(raw)
	primary, standby := New(Config{Limit: 1 << 20}), New(Config{Limit: 1 << 20})
	log := replicate.NewLog(1 << 20)
	for range 3 {
		if !primary.Ship(h, img, "uid:1", log) {
			t.Fatal("ship refused within its budget")
		}
	}
	if n := log.Last(); n != 1 {
		t.Fatalf("%d records after shipping one image three times, want 1", n)
	}
	if !primary.Ship(h, img, "uid:2", log) || log.Last() != 2 {
		t.Fatalf("another tenant's load of the image by hash did not carry it (%d records)", log.Last())
	}
	for range 2 { // the two records
		if err := standby.Receive(raw); err != nil {
			t.Fatal(err)
		}
	}
	if standby.Received(h) == nil || standby.replicaBytes != int64(len(raw)) || primary.shippedBytes != 2*int64(len(raw)) {
		t.Fatalf("the standby holds %d bytes (the primary counted %d)", standby.replicaBytes, primary.shippedBytes)
	}
	primary.ResetShipped()
	primary.Ship(h, img, "uid:1", log)
	if n := log.Last(); n != 3 {
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
