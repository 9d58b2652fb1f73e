// Package images keeps module images by content (abi.ImageHash) for a
// hypervisor node: the images each tenant's guests loaded recently, for
// that tenant's next process that names one by hash; what the replication
// log carried to the standby since the last resync (a primary); what
// this standby received; and the images each session is uploading in
// pieces, too large for one frame (uploads.go).
//
// It owns those stores, their byte bounds, each tenant's share of the
// cache and each tenant's count of uploads. It must never hand an image to a tenant that did not send those
// bytes itself, never let one tenant's use of the cache evict or reveal
// another's images, and never load an image into a GPU: the session does.
package images

import (
	"sync"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// A guest names an image by its hash first (OpModuleLoadCached) and sends
// the bytes only when the node answers StatusUnknownImage; a full load
// leaves its image in its tenant's share of the cache. Three rules keep
// this safe:
//
//   - A hit needs the guest's tenant to have sent those bytes itself
//     before: another tenant cannot learn, by probing hashes, which
//     libraries its neighbours run.
//   - Each tenant has a share of its own (Config.Share bytes, its own least
//     recently used order): its loads evict only its own images, and
//     whether another tenant loaded the same image changes nothing it can
//     see, at any cache size (a cache shared by all let a tenant learn, by
//     which of its own images left, whether a neighbour had loaded one,
//     and evict its neighbours' images at will). The cache holds
//     Limit/Share shares; a share outlives its tenant's sessions (for the
//     tenant's next process), and once every share is taken a new tenant
//     takes the share of the tenant that left longest ago (no session
//     open). A tenant with a session open never loses its share; a new
//     tenant that finds every share held by such tenants caches nothing
//     (its loads send their bytes) until one leaves.
//   - A standby applies a cached load from its own store of images the
//     log carried (OpImage records, at most shippedImageBytes since the
//     last resync, never evicted in between): the primary writes an image
//     into the log the first time a cached load of it by each tenant is
//     logged (so that whether another tenant's load carried it first shows
//     in no reply's timing), and refuses the hit (the guest sends the
//     bytes, which the load's record carries) once that budget is spent.
//     Both sides reset at a resync, when the standby starts from a
//     snapshot. The budget is the node's, not a tenant's: a tenant that
//     spends it makes every tenant's loads by hash send their bytes until
//     the next resync (slower, never wrong).

// Config bounds the cache.
type Config struct {
	// Limit bounds the images the cache keeps, all shares together (0:
	// none).
	Limit int64
	// Share bounds one tenant's images (0, or more than Limit: Limit).
	Share int64
	// Uploads bounds the bytes of images one tenant's sessions are
	// uploading in pieces, together (uploads.go).
	Uploads int64
}

// Cache holds the images each tenant's guests loaded recently, up to its
// share's bound, least recently used first out. Images held by loaded
// modules stay in memory through their sessions either way; the cache
// only keeps them for the next process.
//
// Lock order: mu is a leaf.
type Cache struct {
	mu     sync.Mutex
	share  int64 // one tenant's bound
	shares int   // how many the cache holds
	// byTenant is each tenant's share; sessions counts each tenant's open
	// sessions (Opened, Closed), left orders the shares of tenants with
	// none (Closed numbers them as they go).
	byTenant map[string]*share
	sessions map[string]int
	lefts    uint64
	// shipped is what the log carried to the standby since the last
	// resync, by tenant (primary); replica is what the standby received
	// (standby).
	shipped      map[shipment]bool
	shippedBytes int64
	replica      map[abi.ImageHash]*abi.ModuleImage
	replicaBytes int64
	// uploads counts the bytes each tenant's sessions are uploading, within
	// uploadLimit.
	uploads     map[string]int64
	uploadLimit int64
}

// New returns a cache bounded by cfg.
func New(cfg Config) *Cache {
	c := &Cache{byTenant: map[string]*share{}, sessions: map[string]int{},
		shipped: map[shipment]bool{}, replica: map[abi.ImageHash]*abi.ModuleImage{},
		uploads: map[string]int64{}, uploadLimit: cfg.Uploads}
	if cfg.Limit > 0 {
		c.share = cfg.Limit
		if cfg.Share > 0 && cfg.Share < cfg.Limit {
			c.share = cfg.Share
		}
		c.shares = int(cfg.Limit / c.share)
	}
	return c
}

// Status describes the images a node keeps by content.
type Status struct {
	// Cached images (and their bytes) wait for the next guest of their
	// tenant that names them by hash; Tenants is how many tenants have a
	// share, of the Shares the cache holds.
	Cached      int   `json:"cached"`
	CachedBytes int64 `json:"cached_bytes"`
	Tenants     int   `json:"tenants"`
	Shares      int   `json:"shares"`
	// Shipped: images the log carried to the standby since the last
	// resync (a primary), one per tenant that loaded it by hash;
	// Received: those this standby holds.
	Shipped  int `json:"shipped"`
	Received int `json:"received"`
	// UploadBytes: what sessions are uploading in pieces, every tenant's.
	UploadBytes int64 `json:"upload_bytes"`
}

// Status reports what the stores hold.
func (c *Cache) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := Status{Tenants: len(c.byTenant), Shares: c.shares, Shipped: len(c.shipped), Received: len(c.replica)}
	for _, sh := range c.byTenant {
		st.Cached += len(sh.entries)
		st.CachedBytes += sh.bytes
	}
	for _, n := range c.uploads {
		st.UploadBytes += n
	}
	return st
}
