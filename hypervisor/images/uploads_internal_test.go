package images

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// rawImage is a module_load body of a raw image of n bytes (its framing
// is the GPU driver's to judge, not the upload's).
func rawImage(n int) []byte {
	fat := make([]byte, 16+16+n)
	binary.LittleEndian.PutUint32(fat, abi.FatbinMagic)
	binary.LittleEndian.PutUint16(fat[4:], 1)
	binary.LittleEndian.PutUint16(fat[6:], 16)
	binary.LittleEndian.PutUint64(fat[8:], uint64(16+n))
	binary.LittleEndian.PutUint16(fat[16:], abi.FatbinCubin)
	binary.LittleEndian.PutUint32(fat[20:], 16)
	binary.LittleEndian.PutUint64(fat[24:], uint64(n))
	for i := range n {
		fat[32+i] = byte(i * 7)
	}
	wire, err := abi.RawImage(abi.FormatFatbin, fat)
	if err != nil {
		panic(err)
	}
	return wire
}

// stage sends img to u in pieces of n bytes.
func stage(t *testing.T, u *Uploads, img []byte, n int, counted bool) {
	t.Helper()
	h := abi.HashImage(img)
	for off := 0; off < len(img); off += n {
		r := &abi.ImageStage{Hash: h, Total: uint64(len(img)), Offset: uint64(off), Data: img[off:min(off+n, len(img))]}
		if err := u.Stage(r, counted); err != nil {
			t.Fatalf("piece at %d: %v", off, err)
		}
	}
}

// TestUploadTakesItsBuffer: a finished upload decodes to an image whose
// bytes are the upload's own buffer (no second copy), and Take forgets it
// and gives its bytes back to the tenant.
func TestUploadTakesItsBuffer(t *testing.T) {
	c := New(Config{Uploads: 1 << 20})
	u := c.Uploads("t")
	img := rawImage(100 << 10)
	stage(t, u, img, 7000, true)
	if got := c.Status().UploadBytes; got != int64(len(img)) {
		t.Fatalf("counted %d bytes, want %d", got, len(img))
	}
	m, enc, err := u.Take(abi.HashImage(img))
	if err != nil || m == nil || !bytes.Equal(enc, img) {
		t.Fatalf("Take: %v, %v", m, err)
	}
	if &m.Raw[len(m.Raw)-1] != &enc[len(enc)-1] {
		t.Error("the decoded image is a copy of the upload, not the upload's buffer")
	}
	if got := c.Status().UploadBytes; got != 0 {
		t.Errorf("%d bytes still counted after the load took the upload", got)
	}
	if m, _, _ := u.Take(abi.HashImage(img)); m != nil {
		t.Error("an upload was taken twice")
	}
}

// TestUploadBounds: the tenant's bound counts every session's uploads
// and a standby's count nothing; Free gives everything back; a restart at
// offset 0 replaces the upload without counting it twice.
func TestUploadBounds(t *testing.T) {
	c := New(Config{Uploads: 300 << 10})
	a, b := c.Uploads("t"), c.Uploads("t")
	img := rawImage(200 << 10)
	h := abi.HashImage(img)
	first := &abi.ImageStage{Hash: h, Total: uint64(len(img)), Data: img[:10]}
	if err := a.Stage(first, true); err != nil {
		t.Fatal(err)
	}
	if err := a.Stage(first, true); err != nil { // a restart
		t.Fatalf("restarting an upload: %v", err)
	}
	if err := b.Stage(first, true); !errors.Is(err, abi.StatusOutOfMemory) {
		t.Fatalf("a second session past the tenant's bound: %v", err)
	}
	if err := c.Uploads("other").Stage(first, true); err != nil {
		t.Fatalf("another tenant: %v", err)
	}
	if err := b.Stage(first, false); err != nil {
		t.Fatalf("a standby applying the log: %v", err)
	}
	a.Free()
	b.Free()
	if got := c.Status().UploadBytes; got != int64(len(img)) { // "other"'s
		t.Fatalf("after Free: %d bytes counted, want %d", got, len(img))
	}
}

// FuzzUploads drives one session's uploads with pieces made from the
// fuzzer's bytes: whatever it sends, the node never panics, never counts
// more than the tenant's bound, loads only bytes that hash to their name,
// and counts nothing once the session ends.
func FuzzUploads(f *testing.F) {
	f.Add([]byte{0, 0, 10, 0, 10, 10, 0, 20, 200})
	f.Add([]byte{1, 0, 50, 1, 50, 100, 2, 0, 3, 0, 150, 1})
	f.Add([]byte{0, 5, 5, 3, 0, 0, 0, 0, 255})
	images := [][]byte{rawImage(100), rawImage(300), rawImage(1000), rawImage(20)}
	const bound = 1500
	f.Fuzz(func(t *testing.T, ops []byte) {
		c := New(Config{Uploads: bound})
		u := c.Uploads("t")
		for len(ops) >= 3 {
			img := images[int(ops[0])%len(images)]
			off, n := int(ops[1])*4, int(ops[2])*4
			ops = ops[3:]
			h := abi.HashImage(img)
			if off == 4*255 { // a load by hash
				m, enc, err := u.Take(h)
				if m != nil && (err != nil || abi.HashImage(enc) != h) {
					t.Fatal("took bytes that do not hash to their name")
				}
				continue
			}
			data := img[min(off, len(img)):min(off+n, len(img))]
			if off%8 == 4 { // another image's bytes under this name
				data = images[(int(ops0(ops))+1)%len(images)]
			}
			u.Stage(&abi.ImageStage{Hash: h, Total: uint64(len(img)), Offset: uint64(off), Data: data}, true)
			if held := c.Status().UploadBytes; held > bound {
				t.Fatalf("%d bytes of uploads counted, bound %d", held, bound)
			}
		}
		u.Free()
		if held := c.Status().UploadBytes; held != 0 {
			t.Fatalf("%d bytes counted after the session ended", held)
		}
	})
}

func ops0(ops []byte) byte {
	if len(ops) == 0 {
		return 0
	}
	return ops[0]
}
