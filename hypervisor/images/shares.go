package images

import (
	"container/list"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// share is one tenant's part of the cache: its images, least recently
// used last, within Cache.share bytes.
type share struct {
	bytes   int64
	entries map[abi.ImageHash]*list.Element // of *cachedImage
	lru     list.List                       // front: most recently used
	// left numbers when its tenant's last session closed (0: one is open),
	// so the share of the tenant that left longest ago goes first.
	left uint64
}

type cachedImage struct {
	hash abi.ImageHash
	img  *abi.ModuleImage
	size int64
}

// Opened counts a session of tenant opened and gives the tenant a share
// if it has none and one is to be had: while it has a session, its share
// is its own. Shares go by sessions, never by loads, so whether a tenant
// gets one says nothing of what other tenants loaded.
func (c *Cache) Opened(tenant string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sessions[tenant]++
	if sh := c.shareOf(tenant); sh != nil {
		sh.left = 0
	}
}

// Closed counts a session of tenant closed (Opened counted it).
func (c *Cache) Closed(tenant string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sessions[tenant] > 1 {
		c.sessions[tenant]--
		return
	}
	delete(c.sessions, tenant)
	if sh := c.byTenant[tenant]; sh != nil {
		c.lefts++
		sh.left = c.lefts
	}
}

// Put keeps img (size encoded bytes, hashing to h) in tenant's share,
// making room there by evicting its own least recently used images.
func (c *Cache) Put(h abi.ImageHash, img *abi.ModuleImage, size int64, tenant string) {
	if size <= 0 || size > c.share {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	sh := c.shareOf(tenant)
	if sh == nil {
		return
	}
	if e, ok := sh.entries[h]; ok {
		sh.lru.MoveToFront(e)
		return
	}
	for sh.bytes > c.share-size {
		old := sh.lru.Remove(sh.lru.Back()).(*cachedImage)
		delete(sh.entries, old.hash)
		sh.bytes -= old.size
	}
	sh.entries[h] = sh.lru.PushFront(&cachedImage{hash: h, img: img, size: size})
	sh.bytes += size
}

// Get returns the image hashing to h, and its encoded size, if tenant sent
// it before (it is in tenant's share); nothing else is looked at.
func (c *Cache) Get(h abi.ImageHash, tenant string) (*abi.ModuleImage, int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sh := c.byTenant[tenant]
	if sh == nil {
		return nil, 0
	}
	e, ok := sh.entries[h]
	if !ok {
		return nil, 0
	}
	sh.lru.MoveToFront(e)
	ci := e.Value.(*cachedImage)
	return ci.img, ci.size
}

// shareOf returns tenant's share, giving it one if a share is free or held
// for a tenant with no session open (the one that left longest ago); nil
// if every share is held by a tenant with a session (or the cache keeps
// nothing).
// Precondition: c.mu must be locked.
func (c *Cache) shareOf(tenant string) *share {
	if sh := c.byTenant[tenant]; sh != nil {
		return sh
	}
	if c.shares == 0 {
		return nil
	}
	if len(c.byTenant) >= c.shares {
		gone, oldest := "", uint64(0)
		for t, sh := range c.byTenant {
			if sh.left != 0 && (oldest == 0 || sh.left < oldest) {
				gone, oldest = t, sh.left
			}
		}
		if oldest == 0 {
			return nil
		}
		delete(c.byTenant, gone)
	}
	sh := &share{entries: map[abi.ImageHash]*list.Element{}}
	if c.sessions[tenant] == 0 {
		c.lefts++
		sh.left = c.lefts
	}
	c.byTenant[tenant] = sh
	return sh
}
