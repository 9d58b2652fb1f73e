package hypervisor_test

import (
	"encoding/binary"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/internal/lab/cluster"
	"github.com/vgpuha/vgpuha/kernels"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
	"github.com/vgpuha/vgpuha/replicate/link"
)

// bigFatbin is a fatbin holding the library kernel's PTX and pad bytes of
// code for some other GPU, wrapped for loading (abi.RawImage): larger
// than one request when pad is, and run by the software GPU (its PTX is
// the library's kernel).
func bigFatbin(t testing.TB, kernel string, pad int) []byte {
	t.Helper()
	k, ok := kernels.Lookup(kernel)
	if !ok {
		t.Fatalf("no library kernel %s", kernel)
	}
	le := binary.LittleEndian
	entry := func(b []byte, kind uint16, payload []byte) []byte {
		hdr := make([]byte, 64)
		le.PutUint16(hdr, kind)
		le.PutUint16(hdr[2:], 0x0101)
		le.PutUint32(hdr[4:], 64)
		le.PutUint64(hdr[8:], uint64(len(payload)))
		return append(append(b, hdr...), payload...)
	}
	ptx := make([]byte, (len(k.PTX)+1+7)&^7)
	copy(ptx, k.PTX)
	other := make([]byte, pad)
	for i := range other {
		other[i] = byte(uint32(i) * 2654435761 >> 24)
	}
	fat := make([]byte, 16)
	le.PutUint32(fat, abi.FatbinMagic)
	le.PutUint16(fat[4:], 1)
	le.PutUint16(fat[6:], 16)
	fat = entry(entry(fat, abi.FatbinPTX, ptx), abi.FatbinCubin, other)
	le.PutUint64(fat[8:], uint64(len(fat)-16))
	wire, err := abi.RawImage(abi.FormatFatbin, fat)
	if err != nil {
		t.Fatal(err)
	}
	return wire
}

// runVadd runs vadd, taken from a fatbin (its parameters are bytes, in
// the slots the node reports), over n elements and checks the sums.
func runVadd(t *testing.T, g *pvdriver.Client, f pvdriver.Function, n uint32) {
	t.Helper()
	slots, _, err := g.FunctionParams(f)
	if err != nil || len(slots) != 4 {
		t.Fatalf("vadd's parameters: %v, %v", slots, err)
	}
	a, b := make([]byte, 4*n), make([]byte, 4*n)
	for i := range n {
		binary.LittleEndian.PutUint32(a[4*i:], math.Float32bits(float32(i)*0.5))
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(n-i)*0.25))
	}
	var ptrs [3]pvdriver.DevicePtr
	for i, data := range [][]byte{a, b, make([]byte, 4*n)} {
		ptrs[i] = mustAlloc(t, g, uint64(len(data)), 0xff)
		if err := g.CopyHtoD(ptrs[i], data); err != nil {
			t.Fatal(err)
		}
	}
	var args []abi.Arg
	for i, s := range slots {
		raw := make([]byte, s.Size)
		if i < 3 {
			binary.LittleEndian.PutUint64(raw, uint64(ptrs[i]))
		} else {
			binary.LittleEndian.PutUint32(raw, n)
		}
		args = append(args, pvdriver.Bytes(raw))
	}
	if err := g.Launch(f, pvdriver.LaunchConfig{Grid: pvdriver.Dim(n / 256), Block: pvdriver.Dim(256)}, args...); err != nil {
		t.Fatal(err)
	}
	if err := g.Synchronize(); err != nil {
		t.Fatal(err)
	}
	c := read(t, g, ptrs[2], int(4*n))
	for i := range n {
		want := float32(i)*0.5 + float32(n-i)*0.25
		if got := math.Float32frombits(binary.LittleEndian.Uint32(c[4*i:])); got != want {
			t.Fatalf("c[%d] = %g, want %g", i, got, want)
		}
	}
	for _, p := range ptrs {
		if err := g.Free(p); err != nil {
			t.Fatal(err)
		}
	}
}

// sent is how many requests of op g sent (resends not counted).
func sent(g *pvdriver.Client, op abi.Opcode) uint64 {
	for _, s := range g.Stats() {
		if s.Op == op {
			return s.Sent
		}
	}
	return 0
}

// loadVadd loads image on g and takes vadd from it.
func loadVadd(t *testing.T, g *pvdriver.Client, image []byte) pvdriver.Function {
	t.Helper()
	m, err := g.LoadModule(image)
	if err != nil {
		t.Fatalf("loading a %d-byte image: %v", len(image), err)
	}
	f, err := g.GetFunction(m, "vadd")
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func oneGuestConfig() hypervisor.Config {
	cfg := hypervisor.DefaultConfig()
	cfg.GuestKernels, cfg.MaxSessions = true, 1
	return cfg
}

// TestLargeImageUploaded: an image larger than one request is uploaded in
// pieces and its kernel runs; the node holds no upload once it is loaded,
// and the tenant's next process loads it from the cache, sending nothing.
func TestLargeImageUploaded(t *testing.T) {
	image := bigFatbin(t, "vadd", 20<<20)
	if len(image) <= abi.MaxModuleImage {
		t.Fatalf("a %d-byte image fits one request", len(image))
	}
	e := start(t, oneGuestConfig())
	g := e.client(t, "big")
	runVadd(t, g, loadVadd(t, g, image), 1<<12)
	if n := sent(g, abi.OpImageStage); n < 2 {
		t.Errorf("the image went in %d pieces", n)
	}
	if st := e.srv.Status().Images; st.UploadBytes != 0 || st.Cached != 1 {
		t.Errorf("after the load: %+v; want no upload held, the image cached", st)
	}
	g.Close()
	next := e.client(t, "big again")
	runVadd(t, next, loadVadd(t, next, image), 1<<12)
	if n := sent(next, abi.OpImageStage); n != 0 {
		t.Errorf("the tenant's next process sent %d pieces of an image the node caches", n)
	}
}

// TestLargeImageReplicated: replicated, the standby applies the upload and
// the load (verify matches, the upload counted in neither); the tenant's
// next process loads the image from the primary's cache, sending nothing,
// the log carrying it to the standby as pieces; a failover after that
// load keeps the module; and a standby that joins later gets the module
// from its resync snapshot, in pieces.
func TestLargeImageReplicated(t *testing.T) {
	image := bigFatbin(t, "vadd", 20<<20)
	c := startPair(t, cluster.Options{OneGuestPerProcess: true})
	g := guest(t, c, "big")
	runVadd(t, g, loadVadd(t, g, image), 1<<12)
	if rep, err := c.Verify(); err != nil || !rep.Match {
		t.Fatalf("verify after the load: %+v, %v", rep, err)
	}
	if st := c.Standby.Server().Status().Images; st.UploadBytes != 0 {
		t.Errorf("the standby holds %d bytes of uploads after the load", st.UploadBytes)
	}
	g.Close()
	g = guest(t, c, "big again")
	f := loadVadd(t, g, image)
	if n := sent(g, abi.OpImageStage); n != 0 {
		t.Errorf("the tenant's next process sent %d pieces of an image the primary caches", n)
	}
	runVadd(t, g, f, 1<<12)
	if rep, err := c.Verify(); err != nil || !rep.Match {
		t.Fatalf("verify after the load from the cache: %+v, %v", rep, err)
	}
	c.KillPrimary()
	runVadd(t, g, f, 1<<12) // on the promoted standby
	if c.Standby.Promoted() == nil {
		t.Fatal("the standby was never promoted")
	}

	late, err := cluster.Start(cluster.Options{Replicate: true, Failover: true, Mode: replicate.ModeCommit, OneGuestPerProcess: true,
		FailoverAfter: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(late.Close)
	g = guest(t, late, "big, then a new standby")
	f = loadVadd(t, g, image)
	if err := late.StartStandby(); err != nil {
		t.Fatal(err)
	}
	if err := late.WaitProtected(time.Minute); err != nil {
		t.Fatal(err)
	}
	if rep, err := late.Verify(); err != nil || !rep.Match {
		t.Fatalf("verify after the resync: %+v, %v", rep, err)
	}
	late.KillPrimary()
	runVadd(t, g, f, 1<<12)
}

// TestUploadResumesAcrossFailover: the primary dies while the standby has
// only part of an upload (the records after the first piece are held on
// the link): the guest resends what it has no committed reply for, the
// promoted standby answers the pieces it applied from its state and takes
// the rest, and the upload resumes where the standby's copy ends. Each
// piece was sent once by the guest's code (its resends are the driver's).
func TestUploadResumesAcrossFailover(t *testing.T) {
	image := bigFatbin(t, "vadd", 40<<20)
	var armed atomic.Bool
	var records atomic.Int64
	release := make(chan struct{})
	c := startPair(t, cluster.Options{OneGuestPerProcess: true, Faults: func(m link.Message) bool {
		if m.From != link.FromPrimary || !armed.Load() {
			return true
		}
		if m.Type == "record" && records.Add(1) > 2 { // the failed load by hash, the first piece
			<-release
			return false
		}
		return true
	}})
	var releaseOnce sync.Once
	let := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(let) // runs before the pair's Close: a failed test must not leave the link held
	g := guest(t, c, "interrupted")
	armed.Store(true)
	loaded := make(chan pvdriver.Function, 1)
	go func() {
		m, err := g.LoadModule(image)
		if err != nil {
			t.Errorf("loading across the failover: %v", err)
			loaded <- 0
			return
		}
		f, err := g.GetFunction(m, "vadd")
		if err != nil {
			t.Error(err)
		}
		loaded <- f
	}()
	for deadline := time.Now().Add(time.Minute); records.Load() <= 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the upload's records never reached the link")
		}
	}
	let()
	c.KillPrimary()
	f := <-loaded
	if f == 0 {
		return
	}
	runVadd(t, g, f, 1<<12)
	pieces := uint64((len(image) + 16<<20 - 1) / (16 << 20))
	if n := sent(g, abi.OpImageStage); n > pieces+1 {
		t.Errorf("%d pieces sent for an image of about %d: the upload restarted instead of resuming", n, pieces)
	}
}

// TestHostileUploads: pieces past the bound, out of order, overlapping,
// of another total, for no upload, with the wrong hash, too many uploads,
// a tenant over its bound, and two uploads interleaved: each bad piece
// fails alone, the session and its good uploads carry on, and what a
// session never finished is freed when it ends.
func TestHostileUploads(t *testing.T) {
	cfg := hypervisor.DefaultConfig()
	cfg.ImageUploadBytes = 1 << 20
	e := start(t, cfg)
	r := dialRaw(t, e)
	id := uint64(1)
	call := func(op abi.Opcode, req, reply abi.Body) (abi.Status, string) {
		id++
		return r.send(op, 0, id, req, reply)
	}
	if st, msg := call(abi.OpHello, &abi.Hello{GuestName: "hostile"}, &abi.HelloReply{}); st != abi.StatusOK {
		t.Fatal(msg)
	}
	vadd, err := kernels.Image("vadd")
	if err != nil {
		t.Fatal(err)
	}
	saxpy, err := kernels.Image("saxpy")
	if err != nil {
		t.Fatal(err)
	}
	hv, hs := abi.HashImage(vadd), abi.HashImage(saxpy)
	piece := func(h abi.ImageHash, img []byte, total, off, n int) *abi.ImageStage {
		return &abi.ImageStage{Hash: h, Total: uint64(total), Offset: uint64(off), Data: img[off : off+n]}
	}
	third := len(vadd) / 3
	for _, step := range []struct {
		what string
		req  *abi.ImageStage
		want abi.Status
	}{
		{"a piece for no upload", piece(hv, vadd, len(vadd), third, third), abi.StatusUnknownImage},
		{"a total past the bound", &abi.ImageStage{Hash: hv, Total: abi.MaxImage + 1, Data: vadd[:1]}, abi.StatusInvalidValue},
		{"a piece past its total", &abi.ImageStage{Hash: hv, Total: 4, Offset: math.MaxUint64 - 1, Data: vadd[:4]}, abi.StatusInvalidValue},
		{"more than the tenant may upload", &abi.ImageStage{Hash: hv, Total: 2 << 20, Data: vadd[:1]}, abi.StatusOutOfMemory},
		{"vadd's first piece", piece(hv, vadd, len(vadd), 0, third), abi.StatusOK},
		{"saxpy's first piece, interleaved", piece(hs, saxpy, len(saxpy), 0, 100), abi.StatusOK},
		{"a gap", piece(hv, vadd, len(vadd), third+1, 10), abi.StatusInvalidValue},
		{"an overlap", piece(hv, vadd, len(vadd), third-1, 10), abi.StatusInvalidValue},
		{"another total", piece(hv, vadd, len(vadd)+1, third, 10), abi.StatusInvalidValue},
		{"vadd's second piece", piece(hv, vadd, len(vadd), third, third), abi.StatusOK},
		{"saxpy's last piece", piece(hs, saxpy, len(saxpy), 100, len(saxpy)-100), abi.StatusOK},
		{"vadd's last piece", piece(hv, vadd, len(vadd), 2*third, len(vadd)-2*third), abi.StatusOK},
		{"one piece too many", piece(hv, vadd, len(vadd), 2*third, len(vadd)-2*third), abi.StatusInvalidValue},
	} {
		if st, msg := call(abi.OpImageStage, step.req, nil); st != step.want {
			t.Fatalf("%s: %v (%s), want %v", step.what, st, msg, step.want)
		}
	}
	for _, h := range []abi.ImageHash{hv, hs} {
		if st, msg := call(abi.OpModuleLoadCached, &abi.ModuleLoadCached{Hash: h}, &abi.HandleReply{}); st != abi.StatusOK {
			t.Fatalf("loading an upload finished amid bad pieces: %v (%s)", st, msg)
		}
	}
	// Bytes that do not hash to the name: dropped at the last piece.
	wrong := abi.HashImage([]byte("another image"))
	call(abi.OpImageStage, piece(wrong, vadd, len(vadd), 0, third), nil)
	if st, _ := call(abi.OpImageStage, piece(wrong, vadd, len(vadd), third, len(vadd)-third), nil); st != abi.StatusInvalidValue {
		t.Fatalf("bytes that do not hash to the upload's name: %v", st)
	}
	if st, _ := call(abi.OpModuleLoadCached, &abi.ModuleLoadCached{Hash: wrong}, &abi.HandleReply{}); st != abi.StatusUnknownImage {
		t.Fatalf("loading a dropped upload: %v", st)
	}
	// At most four uploads at once; the ones never finished stay until the
	// session ends.
	for i := range 5 {
		h := abi.HashImage([]byte{byte(i)})
		st, msg := call(abi.OpImageStage, &abi.ImageStage{Hash: h, Total: 100 << 10, Data: vadd[:10]}, nil)
		if want := map[bool]abi.Status{true: abi.StatusOK, false: abi.StatusOutOfMemory}[i < 4]; st != want {
			t.Fatalf("upload %d: %v (%s), want %v", i+1, st, msg, want)
		}
	}
	if held := e.srv.Status().Images.UploadBytes; held != 4*100<<10 {
		t.Fatalf("uploads held: %d bytes, want 4 × 100 KiB", held)
	}
	var ptr abi.AllocReply
	if st, msg := call(abi.OpAlloc, &abi.Alloc{Size: 4096}, &ptr); st != abi.StatusOK {
		t.Fatalf("the session after the bad pieces: %s", msg)
	}
	r.conn.Close()
	for deadline := time.Now().Add(5 * time.Second); e.srv.Status().Images.UploadBytes != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the ended session's uploads are still held: %+v", e.srv.Status().Images)
		}
	}
}

// TestUploadTooLargeForTheGuestDriver: an image over abi.MaxImage is
// refused by the guest driver before it sends anything.
func TestUploadTooLargeForTheGuestDriver(t *testing.T) {
	g := start(t, hypervisor.DefaultConfig()).client(t, "g")
	_, err := g.LoadModuleHashed(make([]byte, abi.MaxImage+1), abi.ImageHash{})
	if !errors.Is(err, abi.StatusInvalidValue) || sent(g, abi.OpImageStage) != 0 {
		t.Fatalf("a %d-byte image: %v, %d pieces sent", abi.MaxImage+1, err, sent(g, abi.OpImageStage))
	}
}
