package images

import (
	"crypto/sha256"
	"hash"

	"github.com/vgpuha/vgpuha/hypervisor/internal/guesterr"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Uploads: module images too large for one frame (abi.ImageStage), each
// uploaded by a session in pieces, in order, then loaded by hash.
//
//   - A session holds at most maxUploads at once (finished or not), each
//     of at most abi.MaxImage bytes; its tenant's sessions together hold
//     at most Config.Uploads bytes of them, counted at the first piece
//     (the announced total), which is host memory the node holds for the
//     tenant like its share of the cache. A standby applying the log
//     counts nothing: its primary did.
//   - A piece must start where the bytes so far end; a piece at offset 0
//     starts the upload afresh (the guest's restart). Anything else (a
//     gap, an overlap, another total) fails that piece alone, and a piece
//     for an upload the session does not hold fails with
//     StatusUnknownImage, which tells the guest to start again from 0 (a
//     node that took over without the pieces before).
//   - The last piece checks the bytes against the hash; a mismatch drops
//     the upload. A finished upload waits for the load that names it by
//     hash (Take), which takes its buffer as the module's image: the node
//     holds one copy of the image, never one per step.
//   - Everything a session still holds is dropped when it ends (Free).

// maxUploads bounds the uploads one session holds at once.
const maxUploads = 4

// Uploads is one session's images being uploaded. Not safe for
// concurrent use: its session's lock serialises it.
type Uploads struct {
	cache  *Cache
	tenant string
	byHash map[abi.ImageHash]*upload
}

type upload struct {
	buf []byte // the bytes so far; cap is the announced total
	sum hash.Hash
	// counted: its bytes count against the tenant's bound (a primary's
	// upload; a standby applying the log counts nothing).
	counted bool
}

func (u *upload) done() bool { return len(u.buf) == cap(u.buf) }

// Uploads returns the uploads of a session of tenant.
func (c *Cache) Uploads(tenant string) *Uploads {
	return &Uploads{cache: c, tenant: tenant, byHash: map[abi.ImageHash]*upload{}}
}

// Stage takes one piece; counted: a new upload counts against the
// tenant's bound (false: a standby applying the log, whose primary did).
func (u *Uploads) Stage(r *abi.ImageStage, counted bool) error {
	if err := r.Check(); err != nil {
		return guesterr.Fail(abi.StatusInvalidValue, "%w", err)
	}
	up := u.byHash[r.Hash]
	if r.Offset == 0 {
		var err error
		if up, err = u.start(r.Hash, r.Total, counted); err != nil {
			return err
		}
	}
	switch {
	case up == nil:
		return guesterr.Fail(abi.StatusUnknownImage, "no upload of image %x in this session: start again from offset 0", r.Hash[:8])
	case up.done():
		return guesterr.Fail(abi.StatusInvalidValue, "image %x is uploaded whole already; a piece at %d is one too many", r.Hash[:8], r.Offset)
	case r.Total != uint64(cap(up.buf)) || r.Offset != uint64(len(up.buf)):
		return guesterr.Fail(abi.StatusInvalidValue, "a piece of image %x at %d of %d bytes: the upload holds %d of %d (pieces go in order, without gaps or overlaps)",
			r.Hash[:8], r.Offset, r.Total, len(up.buf), cap(up.buf))
	}
	up.buf = append(up.buf, r.Data...)
	up.sum.Write(r.Data)
	if up.done() && abi.ImageHash(up.sum.Sum(nil)) != r.Hash {
		u.drop(r.Hash)
		return guesterr.Fail(abi.StatusInvalidValue, "the %d bytes uploaded do not hash to %x; the upload is dropped", r.Total, r.Hash[:8])
	}
	return nil
}

// start begins an upload of total bytes hashing to h, in place of any the
// session holds of h, within the session's and its tenant's bounds.
func (u *Uploads) start(h abi.ImageHash, total uint64, counted bool) (*upload, error) {
	u.drop(h)
	if len(u.byHash) >= maxUploads {
		return nil, guesterr.Fail(abi.StatusOutOfMemory, "this session holds %d image uploads already, the most it may", maxUploads)
	}
	if counted {
		if err := u.cache.reserveUpload(u.tenant, int64(total)); err != nil {
			return nil, err
		}
	}
	up := &upload{buf: make([]byte, 0, total), sum: sha256.New(), counted: counted}
	u.byHash[h] = up
	return up, nil
}

// drop forgets the upload of h, if any, and gives its bytes back.
func (u *Uploads) drop(h abi.ImageHash) {
	up := u.byHash[h]
	if up == nil {
		return
	}
	delete(u.byHash, h)
	if up.counted {
		u.cache.releaseUpload(u.tenant, int64(cap(up.buf)))
	}
}

// Take returns the image a finished upload of h holds, decoded (a raw
// image's bytes are the upload's buffer), and its encoded bytes, and
// forgets the upload; nil if the session holds no finished upload of h.
// An upload whose bytes are no module image is dropped with the error.
func (u *Uploads) Take(h abi.ImageHash) (*abi.ModuleImage, []byte, error) {
	up := u.byHash[h]
	if up == nil || !up.done() {
		return nil, nil, nil
	}
	u.drop(h)
	img, err := abi.DecodeOwnedModuleImage(up.buf)
	if err != nil {
		return nil, nil, guesterr.Fail(abi.StatusInvalidValue, "%w", err)
	}
	return img, up.buf, nil
}

// Each calls fn with every upload the session holds, finished or not:
// its hash, its total and the bytes so far (which fn must not keep or
// change).
func (u *Uploads) Each(fn func(h abi.ImageHash, total uint64, held []byte)) {
	for h, up := range u.byHash {
		fn(h, uint64(cap(up.buf)), up.buf)
	}
}

// Pieces calls fn with the pieces that recreate every upload the session
// holds, finished or not, as far as it got (a resync snapshot).
func (u *Uploads) Pieces(fn func(*abi.ImageStage)) {
	for h, up := range u.byHash {
		for off := 0; off < len(up.buf); off += pieceBytes {
			fn(&abi.ImageStage{Hash: h, Total: uint64(cap(up.buf)), Offset: uint64(off), Data: up.buf[off:min(off+pieceBytes, len(up.buf))]})
		}
	}
}

// Free drops every upload (the session ended).
func (u *Uploads) Free() {
	for h := range u.byHash {
		u.drop(h)
	}
}

// reserveUpload counts n more bytes of uploads for tenant, within the
// tenant's bound.
func (c *Cache) reserveUpload(tenant string, n int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if held := c.uploads[tenant]; n > c.uploadLimit-held {
		return guesterr.Fail(abi.StatusOutOfMemory, "an image upload of %d bytes: tenant %s's sessions hold %d bytes of uploads, at most %d (--guest.image-upload-bytes)",
			n, tenant, held, c.uploadLimit)
	}
	c.uploads[tenant] += n
	return nil
}

// releaseUpload gives n bytes of tenant's uploads back.
func (c *Cache) releaseUpload(tenant string, n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.uploads[tenant] -= n; c.uploads[tenant] <= 0 {
		delete(c.uploads, tenant)
	}
}
