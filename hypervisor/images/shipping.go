package images

import (
	"fmt"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
)

// shippedImageBytes bounds the images a primary carries to its standby
// between two resyncs (the standby keeps them all).
const shippedImageBytes = 2 << 30

// shipment is an image the log carried for a tenant's load by hash.
type shipment struct {
	tenant string
	hash   abi.ImageHash
}

// Ship makes sure the standby will hold img (hashing to h) when it applies
// the next record of tenant's that names it: it appends an OpImage record
// the first time for each tenant, so that one tenant's load never waits
// less because another's carried the image first. It reports false when
// the shipping budget is spent.
func (c *Cache) Ship(h abi.ImageHash, img *abi.ModuleImage, tenant string, log *replicate.Log) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := shipment{tenant, h}
	if c.shipped[key] {
		return true
	}
	body := img.Append(nil)
	if int64(len(body)) > shippedImageBytes-c.shippedBytes {
		return false
	}
	c.shipped[key] = true
	c.shippedBytes += int64(len(body))
	log.Append(replicate.Record{Op: replicate.OpImage, Body: body})
	return true
}

// pieceBytes is the most image bytes one piece the node writes into the
// log (ShipPieces) or a resync snapshot carries.
const pieceBytes = 4 << 20

// ShipPieces carries img (hashing to h), an image too large for one
// record (an OpImage body is one frame's module_load), to the standby as
// the pieces of an upload into session's replica (OpImageStage records
// without a request id), ahead of the load by hash that takes it. The
// standby holds those bytes only until that load takes them, never in its
// store of carried images, so they count against no budget. Each load
// carries them again: whether another tenant loaded the image shows in no
// reply.
func ShipPieces(h abi.ImageHash, img *abi.ModuleImage, session uint64, log *replicate.Log) {
	EachPiece(h, img, func(p *abi.ImageStage) {
		log.Append(replicate.Record{Session: session, Op: replicate.Op(abi.OpImageStage), Body: p.Append(nil)})
	})
}

// EachPiece calls fn with the pieces of an upload of img (hashing to h),
// in order (a resync snapshot's and ShipPieces').
func EachPiece(h abi.ImageHash, img *abi.ModuleImage, fn func(*abi.ImageStage)) {
	total := uint64(img.EncodedSize())
	img.Pieces(pieceBytes, func(off int, data []byte) {
		fn(&abi.ImageStage{Hash: h, Total: total, Offset: uint64(off), Data: data})
	})
}

// ResetShipped forgets what the standby holds: a resync starts it afresh.
func (c *Cache) ResetShipped() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.shipped, c.shippedBytes = map[shipment]bool{}, 0
}

// Receive keeps an image the log carried (a standby applying OpImage).
// The standby keeps one copy of an image whichever tenants' loads carried
// it, so it never holds more than the primary counted.
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
	if int64(len(body)) > shippedImageBytes-c.replicaBytes {
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
