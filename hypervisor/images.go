package hypervisor

import (
	"github.com/vgpuha/vgpuha/handlemap"
	"github.com/vgpuha/vgpuha/hypervisor/images"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Module images by content: a guest names an image by its hash first
// (OpModuleLoadCached) and sends the bytes only when the node answers
// StatusUnknownImage; a full load leaves its image in the node's cache
// (package images, which says what keeps this safe).

// ImageStatus describes the images a node keeps by content.
type ImageStatus = images.Status

// moduleLoadCached loads an image by hash: from the images the log carried
// when replaying, else from the cache (then, when replicating, making sure
// the standby will hold it too).
func (s *Session) moduleLoadCached(r *abi.ModuleLoadCached) (abi.Body, error) {
	images := s.srv.images
	if s.replaying {
		img := images.Received(r.Hash)
		if img == nil {
			return nil, fail(abi.StatusUnknownImage, "no image %x was carried to this standby", r.Hash[:8])
		}
		return s.loadImage(img)
	}
	img, size := images.Get(r.Hash, s.tenantID)
	if img == nil || s.record != nil && !images.Ship(r.Hash, img, s.record.log) {
		return nil, fail(abi.StatusUnknownImage, "this node holds no image %x for tenant %s; send its bytes", r.Hash[:8], s.tenantID)
	}
	s.srv.metrics.imageBytes.WithLabelValues("cache").Add(float64(size))
	return s.loadImage(img)
}

// keepImage caches the image a full load sent (raw: its encoded bytes).
func (s *Session) keepImage(raw []byte, img *abi.ModuleImage) {
	s.srv.metrics.imageBytes.WithLabelValues("guest").Add(float64(len(raw)))
	if s.replaying {
		return
	}
	s.srv.images.Put(abi.HashImage(raw), img, int64(len(raw)), s.tenantID)
}

// loadImage loads a decoded image into the session's context.
// Precondition: s.mu must be locked.
func (s *Session) loadImage(img *abi.ModuleImage) (abi.Body, error) {
	if err := s.checkGuestKernels(img); err != nil {
		return nil, err
	}
	if err := s.checkObjects(); err != nil {
		return nil, err
	}
	m, err := s.ctx.LoadModule(img)
	if err != nil {
		return nil, err
	}
	h, err := s.handles.Insert(handlemap.KindModule, uint64(m), 0)
	if err != nil {
		s.ctx.UnloadModule(m)
		return nil, err
	}
	s.moduleImages[h] = img
	return &abi.HandleReply{Handle: uint64(h)}, nil
}
