package pvdriver

import (
	"errors"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Module images. An image of Options.HashImagesFrom bytes or more is named
// by its hash first (OpModuleLoadCached): the node loads it from its cache
// when this guest's tenant sent it before (an earlier process, usually),
// and the bytes go only when it answers StatusUnknownImage: in one
// request (OpModuleLoad) when they fit one frame, else uploaded in pieces
// of one frame each (OpImageStage, up to abi.MaxImage), several in
// flight, and then named by hash again.
//
// An upload interrupted by a failover resumes: its pieces are requests
// like any other, kept until a commit point and resent, and the node that
// took over holds those the old one had applied (the log carried them).
// Where the node that answers does not hold the upload (a standby that
// joined by a resync after it began holds what the snapshot carried; a
// guest that restarted holds nothing), a piece or the load answers
// StatusUnknownImage and the upload starts again from its first byte, at
// most uploadAttempts times.

// uploadAttempts bounds how often one load uploads its image.
const uploadAttempts = 3

// LoadModule loads a module image (see kernels.Image).
func (c *Client) LoadModule(image []byte) (Module, error) {
	return c.LoadModuleHashed(image, abi.HashImage(image))
}

// LoadModuleHashed is LoadModule for an image whose hash (abi.HashImage)
// the caller already took.
func (c *Client) LoadModuleHashed(image []byte, h abi.ImageHash) (Module, error) {
	if len(image) > abi.MaxImage {
		return 0, &Error{Op: abi.OpImageStage, Status: abi.StatusInvalidValue,
			Message: "a module image of more than abi.MaxImage bytes"}
	}
	if len(image) > c.oneFrameImage() {
		return c.loadUploaded(image, h)
	}
	var r abi.HandleReply
	from := c.opts.HashImagesFrom
	if from <= 0 {
		from = 16 << 10 // below it, the bytes cost about as much as the round trip
	}
	if len(image) >= from {
		err := c.call(abi.OpModuleLoadCached, &abi.ModuleLoadCached{Hash: h}, &r)
		if !errors.Is(err, abi.StatusUnknownImage) {
			return Module(r.Handle), err
		}
	}
	err := c.call(abi.OpModuleLoad, &abi.ModuleLoad{Image: image}, &r)
	return Module(r.Handle), err
}

// oneFrameImage is the largest image one module_load request carries.
func (c *Client) oneFrameImage() int { return min(abi.MaxModuleImage, c.chunk()) }

// loadUploaded loads an image too large for one frame: by hash, uploading
// it first where the node does not hold it.
func (c *Client) loadUploaded(image []byte, h abi.ImageHash) (Module, error) {
	var r abi.HandleReply
	for attempt := 0; ; attempt++ {
		err := c.call(abi.OpModuleLoadCached, &abi.ModuleLoadCached{Hash: h}, &r)
		if !errors.Is(err, abi.StatusUnknownImage) || attempt == uploadAttempts {
			return Module(r.Handle), err
		}
		if err := c.uploadImage(image, h); err != nil && !errors.Is(err, abi.StatusUnknownImage) {
			return 0, err
		}
	}
}

// uploadImage sends image (hashing to h) in pieces of one frame each, in
// order, several in flight (callPieces).
func (c *Client) uploadImage(image []byte, h abi.ImageHash) error {
	total := uint64(len(image))
	return c.callPieces(abi.OpImageStage, len(image), inlineWindow, func(k, n int, ch chan result) (*replyReader, bool, error) {
		req := &abi.ImageStage{Hash: h, Total: total, Offset: uint64(k), Data: image[k : k+n]}
		return c.submit(abi.OpImageStage, req, abi.ImageStageSize(n), ch)
	}, nil)
}
