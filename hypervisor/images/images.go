// Package images keeps module images by content (abi.ImageHash) for a
// hypervisor node: the images guests loaded recently, for the next process
// that names one by hash, what the replication log carried to the standby
// since the last resync (a primary), and what this standby received.
//
// It owns those three stores and their byte bounds. It must never hand an
// image to a tenant that did not send those bytes itself, and never load
// one into a GPU: the session does.
package images

import (
	"container/list"
	"fmt"
	"sync"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
)

// A guest names an image by its hash first (OpModuleLoadCached) and sends
// the bytes only when the node answers StatusUnknownImage; a full load
// leaves its image in the node's cache. Two rules keep this safe:
//
//   - A hit needs the guest's tenant to have sent those bytes itself
//     before: another tenant cannot learn, by probing hashes, which
//     libraries its neighbours run.
//   - A standby applies a cached load from its own store of images the
//     log carried (OpImage records, at most shippedImageBytes since the
//     last resync, never evicted in between): the primary writes an
//     image into the log the first time a cached load of it is logged,
//     and refuses the hit (the guest sends the bytes, which the load's
//     record carries) once that budget is spent. Both sides reset at a
//     resync, when the standby starts from a snapshot.

// shippedImageBytes bounds the images a primary carries to its standby
// between two resyncs (the standby keeps them all).
const shippedImageBytes = 2 << 30

// Cache holds the images guests loaded recently, up to a byte bound,
// least recently used first out. Images held by loaded modules stay in
// memory through their sessions either way; the cache only keeps them
// for the next process.
type Cache struct {
	mu      sync.Mutex
	limit   int64
	bytes   int64
	entries map[abi.ImageHash]*list.Element // of *cachedImage
	lru     list.List                       // front: most recently used
	// shipped is what the log carried to the standby since the last
	// resync (primary); replica is what the standby received (standby).
	shipped      map[abi.ImageHash]bool
	shippedBytes int64
	replica      map[abi.ImageHash]*abi.ModuleImage
	replicaBytes int64
}

type cachedImage struct {
	hash    abi.ImageHash
	img     *abi.ModuleImage
	size    int64
	tenants map[string]bool
}

// New returns a cache of at most limit bytes of images.
func New(limit int64) *Cache {
	return &Cache{limit: limit, entries: map[abi.ImageHash]*list.Element{},
		shipped: map[abi.ImageHash]bool{}, replica: map[abi.ImageHash]*abi.ModuleImage{}}
}

// Put keeps img (size encoded bytes, hashing to h) for tenant.
func (c *Cache) Put(h abi.ImageHash, img *abi.ModuleImage, size int64, tenant string) {
	if size > c.limit {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries[h]; ok {
		e.Value.(*cachedImage).tenants[tenant] = true
		c.lru.MoveToFront(e)
		return
	}
	c.entries[h] = c.lru.PushFront(&cachedImage{hash: h, img: img, size: size, tenants: map[string]bool{tenant: true}})
	c.bytes += size
	for c.bytes > c.limit {
		old := c.lru.Remove(c.lru.Back()).(*cachedImage)
		delete(c.entries, old.hash)
		c.bytes -= old.size
	}
}

// Get returns the image hashing to h, and its encoded size, if tenant
// sent it before.
func (c *Cache) Get(h abi.ImageHash, tenant string) (*abi.ModuleImage, int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[h]
	if !ok || !e.Value.(*cachedImage).tenants[tenant] {
		return nil, 0
	}
	c.lru.MoveToFront(e)
	ci := e.Value.(*cachedImage)
	return ci.img, ci.size
}

// Ship makes sure the standby will hold img (hashing to h) when it applies
// the next record that names it: it appends an OpImage record the first
// time. It reports false when the shipping budget is spent.
func (c *Cache) Ship(h abi.ImageHash, img *abi.ModuleImage, log *replicate.Log) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.shipped[h] {
		return true
	}
	body := img.Append(nil)
	if c.shippedBytes+int64(len(body)) > shippedImageBytes {
		return false
	}
	c.shipped[h] = true
	c.shippedBytes += int64(len(body))
	log.Append(replicate.Record{Op: replicate.OpImage, Body: body})
	return true
}

// ResetShipped forgets what the standby holds: a resync starts it afresh.
func (c *Cache) ResetShipped() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.shipped, c.shippedBytes = map[abi.ImageHash]bool{}, 0
}

// Receive keeps an image the log carried (a standby applying OpImage).
func (c *Cache) Receive(body []byte) error {
	img, err := abi.DecodeModuleImage(body)
	if err != nil {
		return fmt.Errorf("image record: %w", err)
	}
	h := abi.HashImage(body)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.replica[h] != nil {
		return nil
	}
	if c.replicaBytes+int64(len(body)) > shippedImageBytes {
		return fmt.Errorf("image record: the primary carried more than %d bytes of images since the resync", shippedImageBytes)
	}
	c.replica[h] = img
	c.replicaBytes += int64(len(body))
	return nil
}

// Received returns an image the log carried.
func (c *Cache) Received(h abi.ImageHash) *abi.ModuleImage {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.replica[h]
}

// ResetReceived drops the carried images (a standby applying OpReset).
func (c *Cache) ResetReceived() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.replica, c.replicaBytes = map[abi.ImageHash]*abi.ModuleImage{}, 0
}

// Status describes the images a node keeps by content.
type Status struct {
	// Cached images (and their bytes) wait for the next guest that names
	// them by hash.
	Cached      int   `json:"cached"`
	CachedBytes int64 `json:"cached_bytes"`
	// Shipped: images the log carried to the standby since the last
	// resync (a primary); Received: those this standby holds.
	Shipped  int `json:"shipped"`
	Received int `json:"received"`
}

// Status reports what the stores hold.
func (c *Cache) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Status{Cached: len(c.entries), CachedBytes: c.bytes, Shipped: len(c.shipped), Received: len(c.replica)}
}
