package hypervisor_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/internal/lab/workload"
	"github.com/vgpuha/vgpuha/kernels"
	"github.com/vgpuha/vgpuha/mmiotrace"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

type env struct {
	srv      *hypervisor.Server
	backend  *sim.Backend
	reg      *prometheus.Registry
	endpoint string
}

func start(t testing.TB, cfg hypervisor.Config) *env {
	t.Helper()
	e := &env{backend: sim.New(1 << 30), reg: prometheus.NewRegistry()}
	srv, err := hypervisor.NewServer(e.backend, cfg, e.reg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "g.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	e.srv, e.endpoint = srv, "unix://"+sock
	return e
}

func (e *env) client(t testing.TB, name string) *pvdriver.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := pvdriver.Open(ctx, e.endpoint, pvdriver.Options{GuestName: name})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestWorkloads(t *testing.T) {
	e := start(t, hypervisor.DefaultConfig())
	c := e.client(t, "g")
	ws, _ := workload.Select("all")
	for _, w := range ws {
		r, err := w.Run(context.Background(), c, 0)
		if err != nil {
			t.Fatal(err)
		}
		if !r.Verified {
			t.Errorf("%s: wrong result: %s", r.Name, r.Detail)
		}
	}
}

func mustAlloc(t *testing.T, c *pvdriver.Client, n uint64, fill byte) pvdriver.DevicePtr {
	t.Helper()
	p, err := c.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CopyHtoD(p, bytes.Repeat([]byte{fill}, int(n))); err != nil {
		t.Fatal(err)
	}
	return p
}

func read(t *testing.T, c *pvdriver.Client, p pvdriver.DevicePtr, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if err := c.CopyDtoH(b, p); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestIsolation: a guest cannot read, write, copy from or launch on another
// guest's memory, even knowing its exact address.
func TestIsolation(t *testing.T) {
	e := start(t, hypervisor.DefaultConfig())
	a, b := e.client(t, "a"), e.client(t, "b")
	pa := mustAlloc(t, a, 4096, 0xaa)
	pb := mustAlloc(t, b, 4096, 0xbb)

	if err := b.CopyDtoH(make([]byte, 16), pa); !errors.Is(err, pvdriver.ErrOutOfRange) {
		t.Errorf("b reading a's memory: %v", err)
	}
	if err := b.CopyHtoD(pa, []byte{1, 2, 3}); !errors.Is(err, pvdriver.ErrOutOfRange) {
		t.Errorf("b writing a's memory: %v", err)
	}
	if err := b.CopyDtoD(pb, pa, 16); !errors.Is(err, pvdriver.ErrOutOfRange) {
		t.Errorf("b copying from a's memory: %v", err)
	}
	if err := b.Memset8(pa, 0, 16); !errors.Is(err, pvdriver.ErrOutOfRange) {
		t.Errorf("b memsetting a's memory: %v", err)
	}
	if err := b.Free(pa); !errors.Is(err, pvdriver.ErrInvalidValue) {
		t.Errorf("b freeing a's memory: %v", err)
	}
	img, _ := kernels.Image("vadd")
	m, err := b.LoadModule(img)
	if err != nil {
		t.Fatal(err)
	}
	f, err := b.GetFunction(m, "vadd")
	if err != nil {
		t.Fatal(err)
	}
	cfg := pvdriver.LaunchConfig{Grid: pvdriver.Dim(1), Block: pvdriver.Dim(64)}
	b.Launch(f, cfg, pvdriver.Ptr(pb), pvdriver.Ptr(pb), pvdriver.Ptr(pa), pvdriver.U32(64))
	if err := b.Synchronize(); !errors.Is(err, pvdriver.ErrOutOfRange) {
		t.Errorf("b launching onto a's memory: %v", err)
	}
	// A launch whose pointer is b's own but whose kernel runs past the end
	// of b's allocation into a's window faults instead of touching a.
	b.Launch(f, pvdriver.LaunchConfig{Grid: pvdriver.Dim(64), Block: pvdriver.Dim(256)},
		pvdriver.Ptr(pb), pvdriver.Ptr(pb), pvdriver.Ptr(pb), pvdriver.U32(64*256))
	if err := b.Synchronize(); !errors.Is(err, pvdriver.ErrLaunchFailed) {
		t.Errorf("b's kernel overrunning its allocation: %v", err)
	}
	// a's handles mean nothing to b.
	if _, err := a.GetFunction(m, "vadd"); !errors.Is(err, pvdriver.ErrInvalidHandle) {
		t.Errorf("a using b's module handle: %v", err)
	}
	if got := read(t, a, pa, 4096); !bytes.Equal(got, bytes.Repeat([]byte{0xaa}, 4096)) {
		t.Error("a's memory changed")
	}
}

// TestRefusedRequestsChangeNothing: every bad request gets a clear typed
// error and leaves memory, handles and quota as they were.
func TestRefusedRequestsChangeNothing(t *testing.T) {
	cfg := hypervisor.DefaultConfig()
	cfg.MemoryQuota = 1 << 20
	cfg.MaxObjects = 8
	e := start(t, cfg)
	c := e.client(t, "g")
	p := mustAlloc(t, c, 4096, 0x11)
	want := bytes.Repeat([]byte{0x11}, 4096)
	s, err := c.CreateStream()
	if err != nil {
		t.Fatal(err)
	}
	img, _ := kernels.Image("saxpy")
	m, err := c.LoadModule(img)
	if err != nil {
		t.Fatal(err)
	}
	f, err := c.GetFunction(m, "saxpy")
	if err != nil {
		t.Fatal(err)
	}
	launch := func(cfg pvdriver.LaunchConfig, args ...abi.Arg) error {
		if err := c.Launch(f, cfg, args...); err != nil {
			return err
		}
		return c.Synchronize()
	}
	one := pvdriver.LaunchConfig{Grid: pvdriver.Dim(1), Block: pvdriver.Dim(32)}
	good := []abi.Arg{pvdriver.Ptr(p), pvdriver.Ptr(p), pvdriver.F32(1), pvdriver.U32(32)}
	cases := []struct {
		name string
		call func() error
		want error
	}{
		{"copy straddling the end", func() error { return c.CopyHtoD(p+4000, make([]byte, 200)) }, pvdriver.ErrOutOfRange},
		{"copy before the start", func() error { return c.CopyHtoD(p-1, []byte{0}) }, pvdriver.ErrOutOfRange},
		{"read past the end", func() error { return c.CopyDtoH(make([]byte, 4097), p) }, pvdriver.ErrOutOfRange},
		{"address wrap", func() error { return c.CopyDtoD(p, p+8, ^uint64(0)-4) }, pvdriver.ErrOutOfRange},
		{"memset width 3", func() error { return c.Memset32(p, 0, 1<<62) }, pvdriver.ErrOutOfRange},
		{"zero-byte alloc", func() error { _, err := c.Alloc(0); return err }, pvdriver.ErrInvalidValue},
		{"over quota", func() error { _, err := c.Alloc(2 << 20); return err }, pvdriver.ErrOutOfMemory},
		{"free unknown", func() error { return c.Free(p + 8) }, pvdriver.ErrInvalidValue},
		{"unknown stream", func() error { return c.CopyHtoDAsync(p, []byte{0}, s+100) }, nil},
		{"unknown module", func() error { _, err := c.GetFunction(m+100, "saxpy"); return err }, pvdriver.ErrInvalidHandle},
		{"function as module", func() error { _, err := c.GetFunction(pvdriver.Module(f), "saxpy"); return err }, pvdriver.ErrInvalidHandle},
		{"unknown kernel name", func() error { _, err := c.GetFunction(m, "nope"); return err }, pvdriver.ErrInvalidValue},
		{"garbage module image", func() error { _, err := c.LoadModule([]byte("garbage")); return err }, pvdriver.ErrInvalidValue},
		{"too few args", func() error { return launch(one, good[:3]...) }, pvdriver.ErrInvalidValue},
		{"wrong arg kind", func() error { return launch(one, good[0], good[1], pvdriver.U32(1), good[3]) }, pvdriver.ErrInvalidValue},
		{"empty grid", func() error { return launch(pvdriver.LaunchConfig{Block: pvdriver.Dim(1)}, good...) }, pvdriver.ErrInvalidValue},
		{"2048 threads", func() error {
			return launch(pvdriver.LaunchConfig{Grid: pvdriver.Dim(1), Block: pvdriver.Dim(2048)}, good...)
		}, pvdriver.ErrInvalidValue},
		{"too much shared", func() error {
			return launch(pvdriver.LaunchConfig{Grid: pvdriver.Dim(1), Block: pvdriver.Dim(1), SharedBytes: 1 << 20}, good...)
		}, pvdriver.ErrInvalidValue},
		{"pointer outside", func() error { return launch(one, pvdriver.Ptr(p+4096), good[1], good[2], good[3]) }, pvdriver.ErrOutOfRange},
		{"destroy null stream", func() error { return c.DestroyStream(0) }, pvdriver.ErrInvalidHandle},
	}
	for _, tc := range cases {
		err := tc.call()
		if tc.want == nil { // async: the error surfaces at the next sync
			if err != nil {
				t.Errorf("%s: async call failed at once: %v", tc.name, err)
			}
			err, tc.want = c.Synchronize(), pvdriver.ErrInvalidHandle
		}
		var pe *pvdriver.Error
		if !errors.Is(err, tc.want) || !errors.As(err, &pe) || pe.Message == "" {
			t.Errorf("%s: got %v, want %v with a message", tc.name, err, tc.want)
		}
	}
	if got := read(t, c, p, 4096); !bytes.Equal(got, want) {
		t.Error("memory changed by refused requests")
	}
	st := e.srv.Status()
	if len(st.Sessions) != 1 || st.Sessions[0].Allocations != 1 || st.Sessions[0].Objects != 4 {
		t.Errorf("status after refused requests: %+v", st.Sessions)
	}
	// The session still works: fill the object quota exactly.
	for i := 0; i < 4; i++ {
		if _, err := c.CreateStream(); err != nil {
			t.Fatalf("stream %d within quota: %v", i, err)
		}
	}
	if _, err := c.CreateStream(); !errors.Is(err, pvdriver.ErrOutOfMemory) {
		t.Errorf("stream over object quota: %v", err)
	}
}

func TestModuleUnloadCascades(t *testing.T) {
	e := start(t, hypervisor.DefaultConfig())
	c := e.client(t, "g")
	img, _ := kernels.Image("vadd", "saxpy")
	m, err := c.LoadModule(img)
	if err != nil {
		t.Fatal(err)
	}
	f, err := c.GetFunction(m, "vadd")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.UnloadModule(m); err != nil {
		t.Fatal(err)
	}
	p := mustAlloc(t, c, 1024, 0)
	c.Launch(f, pvdriver.LaunchConfig{Grid: pvdriver.Dim(1), Block: pvdriver.Dim(1)}, pvdriver.Ptr(p), pvdriver.Ptr(p), pvdriver.Ptr(p), pvdriver.U32(1))
	if err := c.Synchronize(); !errors.Is(err, pvdriver.ErrInvalidHandle) {
		t.Errorf("launch of an unloaded module's function: %v", err)
	}
	if n := e.srv.Status().Sessions[0].Objects; n != 1 {
		t.Errorf("objects after unload: %d, want 1 (the allocation)", n)
	}
}

func TestSimRefusesForeignKernels(t *testing.T) {
	e := start(t, hypervisor.DefaultConfig())
	c := e.client(t, "g")
	k, _ := kernels.Lookup("vadd")
	spec := k.Spec()
	spec.PTX += "// changed"
	img := (&abi.ModuleImage{Kernels: []abi.KernelSpec{spec}}).Append(nil)
	if _, err := c.LoadModule(img); !errors.Is(err, pvdriver.ErrNotSupported) {
		t.Errorf("altered PTX: %v", err)
	}
	img = (&abi.ModuleImage{Kernels: []abi.KernelSpec{{Name: "mystery", PTX: "x"}}}).Append(nil)
	if _, err := c.LoadModule(img); !errors.Is(err, pvdriver.ErrNotSupported) {
		t.Errorf("unknown kernel: %v", err)
	}
}

// rawConn opens a connection and sends b; it returns the replies read until
// the hypervisor closes the connection.
func rawConn(t *testing.T, e *env, b []byte) []byte {
	t.Helper()
	conn, err := net.Dial("unix", e.endpoint[len("unix://"):])
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.Write(b)
	conn.(*net.UnixConn).CloseWrite() // as a guest that dies: no more bytes
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	out, _ := io.ReadAll(conn)
	return out
}

func hello(id uint64) []byte {
	return abi.AppendFrame(nil, abi.OpHello, 0, id, (&abi.Hello{GuestName: "raw"}).Append(nil))
}

func lastStatus(t *testing.T, replies []byte) (abi.Header, abi.Status, string) {
	t.Helper()
	fr := abi.NewFrameReader(bytes.NewReader(replies), 1<<20)
	var h abi.Header
	var st abi.Status
	var msg string
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return h, st, msg
		}
		h = f.Header
		st, msg, _ = abi.DecodeReply(f.Payload, nil)
	}
}

// TestMisbehavingGuests: garbage, bad frames and connections cut mid-frame
// get an error reply (where anyone is left to read it) and end only their
// own connection; a well-behaved guest carries on throughout and the
// misbehaving guests' sessions are freed.
func TestMisbehavingGuests(t *testing.T) {
	e := start(t, hypervisor.DefaultConfig())
	good := e.client(t, "good")
	p := mustAlloc(t, good, 1<<16, 0x5a)

	alloc := abi.AppendFrame(nil, abi.OpAlloc, 0, 2, (&abi.Alloc{Size: 1 << 20}).Append(nil))
	bigHeader := abi.AppendFrame(nil, abi.OpCopyHtoD, 0, 3, nil)
	binary.LittleEndian.PutUint32(bigHeader[20:], 1<<30)
	badCRC := append([]byte(nil), alloc...)
	badCRC[len(badCRC)-1] ^= 1
	cases := []struct {
		name   string
		stream []byte
		want   abi.Status // StatusOK: no reply expected
		id     uint64
	}{
		{"garbage", []byte("GET / HTTP/1.1\r\nHost: example\r\nAccept: */*\r\n\r\n"), abi.StatusBadFrame, 0},
		{"request before hello", alloc, abi.StatusInvalidValue, 2},
		{"too-large frame", append(hello(1), bigHeader...), abi.StatusBadFrame, 3},
		{"bad checksum", append(hello(1), badCRC...), abi.StatusBadFrame, 2},
		{"cut mid-frame", append(hello(1), alloc[:len(alloc)-4]...), abi.StatusOK, 1},
		{"cut mid-header", append(append(hello(1), alloc...), alloc[:7]...), abi.StatusOK, 2},
		{"malformed body", append(hello(1), abi.AppendFrame(nil, abi.OpAlloc, 0, 5, []byte{1, 2, 3})...), abi.StatusInvalidValue, 5},
		{"reply frame from guest", append(hello(1), abi.AppendFrame(nil, abi.OpSync, abi.FlagReply, 6, nil)...), abi.StatusBadFrame, 6},
		{"sync sent async", append(hello(1), abi.AppendFrame(nil, abi.OpSync, abi.FlagAsync, 7, nil)...), abi.StatusInvalidValue, 7},
	}
	for _, tc := range cases {
		replies := rawConn(t, e, tc.stream)
		h, st, msg := lastStatus(t, replies)
		if tc.want != abi.StatusOK && (st != tc.want || h.RequestID != tc.id || msg == "") {
			t.Errorf("%s: last reply id %d status %v %q, want id %d status %v", tc.name, h.RequestID, st, msg, tc.id, tc.want)
		}
		if got := read(t, good, p, 1<<16); !bytes.Equal(got, bytes.Repeat([]byte{0x5a}, 1<<16)) {
			t.Fatalf("%s: good guest's memory changed", tc.name)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(e.srv.Status().Sessions) != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if st := e.srv.Status(); len(st.Sessions) != 1 || e.backend.Used() != 1<<16 {
		t.Errorf("after misbehaving guests left: %d sessions, %d device bytes; want 1 and %d", len(st.Sessions), e.backend.Used(), 1<<16)
	}
}

func TestMetricsLint(t *testing.T) {
	e := start(t, hypervisor.DefaultConfig())
	e.client(t, "g").Synchronize()
	problems, err := testutil.GatherAndLint(e.reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("metric %s: %s", p.Metric, p.Text)
	}
	if n := testutil.CollectAndCount(e.reg, "vgpuha_guest_requests_total"); n == 0 {
		t.Error("no request counter series after a request")
	}
}

// TestApertureInOwnProcess maps apertures from a guest that is the
// hypervisor's own process: ptrace modes refuse it as not supported, and
// nothing stays allocated; uffd mode (no ptrace) serves it.
func TestApertureInOwnProcess(t *testing.T) {
	cfg := hypervisor.DefaultConfig()
	cfg.MMIO.Mode = mmiotrace.ModePage
	e := start(t, cfg)
	c := e.client(t, "self")
	if _, err := c.MapAperture(4096, pvdriver.Memory); !errors.Is(err, abi.StatusNotSupported) {
		t.Fatalf("page mode in the hypervisor's own process: %v", err)
	}
	if st := e.srv.Status(); st.Objects != 0 {
		t.Fatalf("a refused aperture left %d objects", st.Objects)
	}
	if mmiotrace.UffdAvailable() != nil {
		t.Skip("uffd mode needs Linux 6.7+")
	}
	cfg.MMIO.Mode = mmiotrace.ModeUffd
	e = start(t, cfg)
	c = e.client(t, "self")
	a, err := c.MapAperture(4096, pvdriver.Memory)
	if err != nil {
		t.Fatal(err)
	}
	a.Mem[100] = 7
	got := make([]byte, 4096)
	if err := c.CopyDtoH(got, a.Ptr); err != nil || got[100] != 7 {
		t.Fatalf("device copy after a write: %v %d", err, got[100])
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestRequestBytesCounted: vgpuha_guest_request_bytes_total grows by a
// request frame's header and payload, a copy's data included, so that
// link bytes can be set beside what guests sent.
func TestRequestBytesCounted(t *testing.T) {
	e := start(t, hypervisor.DefaultConfig())
	c := e.client(t, "g")
	p, err := c.Alloc(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	before := counter(t, e, "vgpuha_guest_request_bytes_total", nil)
	if err := c.CopyHtoD(p, make([]byte, 1<<16)); err != nil {
		t.Fatal(err)
	}
	if got := counter(t, e, "vgpuha_guest_request_bytes_total", nil) - before; got < 1<<16 || got > 1<<16+256 {
		t.Fatalf("a 64 KiB copy counted %v request bytes, want 64 KiB and its header", got)
	}
}
