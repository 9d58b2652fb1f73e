package hypervisor_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/kernels"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// tenantSession is a session over tcp from one address, speaking frames
// by hand.
type tenantSession struct {
	*raw
	next uint64
}

func openTenantSession(t *testing.T, addr, from string) *tenantSession {
	t.Helper()
	conn := dialFrom(t, addr, from)
	t.Cleanup(func() { conn.Close() })
	s := &tenantSession{raw: &raw{t: t, conn: conn, fr: abi.NewFrameReader(conn, 1<<20)}}
	if st, msg := s.call(abi.OpHello, &abi.Hello{GuestName: from}, &abi.HelloReply{}); st != abi.StatusOK {
		t.Fatal(msg)
	}
	return s
}

func (s *tenantSession) call(op abi.Opcode, req, reply abi.Body) (abi.Status, string) {
	s.t.Helper()
	s.next++
	return s.send(op, 0, s.next, req, reply)
}

// loadByHash asks for the image hashing to h; the message leaves out the
// hash (the guest's own input).
func (s *tenantSession) loadByHash(image []byte) (abi.Status, string) {
	s.t.Helper()
	h := abi.HashImage(image)
	st, msg := s.call(abi.OpModuleLoadCached, &abi.ModuleLoadCached{Hash: h}, &abi.HandleReply{})
	return st, strings.ReplaceAll(msg, fmt.Sprintf("%x", h[:8]), "HASH")
}

func (s *tenantSession) load(image []byte) {
	s.t.Helper()
	if st, msg := s.call(abi.OpModuleLoad, &abi.ModuleLoad{Image: image}, &abi.HandleReply{}); st != abi.StatusOK {
		s.t.Fatal(msg)
	}
}

// TestImageCacheSharesPerTenant: over a node with a small image cache, the
// two probes of issue 47 find nothing. Membership: tenant A's load by hash
// of an image only B loaded gets exactly the answer of one nobody loaded.
// Eviction: A loading image after image, past its share many times over,
// leaves B's image in B's share (B's next load by hash is served).
func TestImageCacheSharesPerTenant(t *testing.T) {
	var images [][]byte
	var largest int
	for _, name := range kernels.Names() {
		img, err := kernels.Image(name)
		if err != nil {
			t.Fatal(err)
		}
		images, largest = append(images, img), max(largest, len(img))
	}
	if len(images) < 4 {
		t.Fatalf("%d library kernels; the test needs 4", len(images))
	}
	cfg := hypervisor.DefaultConfig()
	cfg.ImageCacheBytes, cfg.ImageCacheTenantBytes = 4*int64(largest), 2*int64(largest)
	e, addr := startTCP(t, cfg)
	a, b := openTenantSession(t, addr, "127.0.0.2"), openTenantSession(t, addr, "127.0.0.3")
	onlyB, nobody, others := images[0], images[1], images[2:]
	if bytes.Equal(onlyB, nobody) {
		t.Fatal("two library images are the same")
	}
	b.load(onlyB)
	stB, msgB := a.loadByHash(onlyB)
	stNone, msgNone := a.loadByHash(nobody)
	if stB != abi.StatusUnknownImage || stB != stNone || msgB != msgNone {
		t.Errorf("tenant A tells an image B loaded from one nobody did:\n B's:     %v %q\n nobody's: %v %q", stB, msgB, stNone, msgNone)
	}
	for range 10 {
		for _, img := range others {
			a.load(img)
		}
		a.load(onlyB) // A sends B's image itself: its own copy, in its own share
	}
	if st, msg := b.loadByHash(onlyB); st != abi.StatusOK {
		t.Errorf("tenant A's loads evicted tenant B's image: %v %s", st, msg)
	}
	if st, _ := a.loadByHash(onlyB); st != abi.StatusOK {
		t.Error("tenant A's own copy of the image left its share")
	}
	if st := e.srv.Status().Images; st.Tenants != 2 || st.Shares != 2 || st.CachedBytes > cfg.ImageCacheBytes {
		t.Errorf("image status %+v", st)
	}
}
