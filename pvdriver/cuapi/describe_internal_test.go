package cuapi

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/internal/lab/cluster"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// stack is a calling thread's context stack, as the C half keeps it.
type stack struct{ ctxs []uint64 }

func (s *stack) Top() uint64 {
	if len(s.ctxs) == 0 {
		return 0
	}
	return s.ctxs[len(s.ctxs)-1]
}
func (s *stack) SetTop(c uint64) {
	if len(s.ctxs) == 0 {
		s.ctxs = append(s.ctxs, c)
	} else {
		s.ctxs[len(s.ctxs)-1] = c
	}
}
func (s *stack) Push(c uint64) bool { s.ctxs = append(s.ctxs, c); return true }
func (s *stack) Pop() uint64 {
	c := s.Top()
	if len(s.ctxs) > 0 {
		s.ctxs = s.ctxs[:len(s.ctxs)-1]
	}
	return c
}

// driverWithContext is a driver whose session is on a primary of the
// software GPU, and a thread with a context made current (its handle).
func driverWithContext(t testing.TB) (*Driver, *stack, uint64) {
	t.Helper()
	c, err := cluster.Start(cluster.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	t.Setenv("VGPUHA_ENDPOINT", c.Endpoint)
	d, th := New(), &stack{}
	if r := d.Init(0); r != Success {
		t.Fatalf("Init: %d", r)
	}
	t.Cleanup(d.Shutdown)
	ctx, r := d.CtxCreate(th, 0, 0, false)
	if r != Success {
		t.Fatalf("CtxCreate: %d", r)
	}
	return d, th, ctx
}

// TestLookupsAskOnce: looking a function up asks the node once, and its
// attributes only when first needed; most functions a library looks up are
// never launched, so a lookup is one round trip, not two.
func TestLookupsAskOnce(t *testing.T) {
	d, th, _ := driverWithContext(t)
	ptx, err := os.ReadFile("../../kernels/ptx/vadd.ptx")
	if err != nil {
		t.Fatal(err)
	}
	m, r := d.ModuleLoadData(th, append(ptx, 0))
	if r != Success {
		t.Fatalf("ModuleLoadData: %d", r)
	}
	var f uint64
	for range 5 {
		if f, r = d.ModuleGetFunction(m, "vadd"); r != Success {
			t.Fatalf("ModuleGetFunction: %d", r)
		}
	}
	if got := sent(d, abi.OpGetFunction, abi.OpFunctionParams); got != [2]uint64{1, 0} {
		t.Errorf("after 5 lookups: %d get_function, %d function_params sent; want 1, 0", got[0], got[1])
	}
	for range 3 {
		if _, r := d.FuncGetAttribute(0, f); r != Success {
			t.Fatalf("FuncGetAttribute: %d", r)
		}
	}
	if got := sent(d, abi.OpGetFunction, abi.OpFunctionParams); got != [2]uint64{1, 1} {
		t.Errorf("after 3 attribute reads: %d get_function, %d function_params sent; want 1, 1", got[0], got[1])
	}
}

// sent is how many requests of ops a and b d's client sent.
func sent(d *Driver, a, b abi.Opcode) (n [2]uint64) {
	for _, s := range d.client.Stats() {
		switch s.Op {
		case a:
			n[0] = s.Sent
		case b:
			n[1] = s.Sent
		}
	}
	return n
}

// TestImageSizeOfLargeImages: the size a fatbin's or cubin's headers give
// is answered however large (the caller refuses one over abi.MaxImage,
// saying so), and only headers whose size overflows are not.
func TestImageSizeOfLargeImages(t *testing.T) {
	head := make([]byte, 64)
	binary.LittleEndian.PutUint32(head, fatbinMagic)
	binary.LittleEndian.PutUint16(head[6:], 16)
	for _, c := range []struct {
		body uint64
		want uint64
		ok   bool
	}{{100 << 20, 16 + 100<<20, true}, {abi.MaxImage, 16 + abi.MaxImage, true}, {math.MaxUint64 - 16, math.MaxUint64, true}, {math.MaxUint64 - 15, 0, false}} {
		binary.LittleEndian.PutUint64(head[8:], c.body)
		if n, ptx, ok := ImageSize(head); n != c.want || ptx || ok != c.ok {
			t.Errorf("a fatbin announcing %d bytes: %d, %v, %v; want %d, %v", c.body, n, ptx, ok, c.want, c.ok)
		}
	}
	elf := make([]byte, 64)
	copy(elf, "\x7fELF\x02\x01\x01")
	binary.LittleEndian.PutUint64(elf[0x28:], 200<<20)
	binary.LittleEndian.PutUint16(elf[0x3a:], 64)
	binary.LittleEndian.PutUint16(elf[0x3c:], 3)
	if n, _, ok := ImageSize(elf); n != 200<<20+3*64 || !ok {
		t.Errorf("a 200 MiB cubin: %d, %v", n, ok)
	}
	binary.LittleEndian.PutUint64(elf[0x28:], math.MaxUint64-10)
	if _, _, ok := ImageSize(elf); ok {
		t.Error("a cubin whose section table wraps around was sized")
	}
}

// TestLargeImageRefusedLoudly: an image whose headers announce more than
// abi.MaxImage is refused with a line naming its size and the bound.
func TestLargeImageRefusedLoudly(t *testing.T) {
	head := make([]byte, 64)
	binary.LittleEndian.PutUint32(head, fatbinMagic)
	binary.LittleEndian.PutUint16(head[6:], 16)
	binary.LittleEndian.PutUint64(head[8:], 2<<30)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := os.Stderr
	os.Stderr = w
	_, ok := rawSize(head)
	os.Stderr = stderr
	w.Close()
	said, _ := io.ReadAll(r)
	if ok || !strings.Contains(string(said), fmt.Sprintf("%d bytes is refused", 2<<30+16)) ||
		!strings.Contains(string(said), fmt.Sprint(abi.MaxImage)) {
		t.Fatalf("a 2 GiB fatbin: sized %v, said %q", ok, said)
	}
}

// TestPinnedGPU: VGPUHA_GPU pins the library's session to one of a
// multi-GPU node's GPUs, whose memory the program then sees (its UUID is
// the pair's name for it: hypervisor's identity.go); a
// pin to a GPU the node does not serve leaves the program no device.
func TestPinnedGPU(t *testing.T) {
	c, err := cluster.Start(cluster.Options{NewBackend: func() (gpu.Backend, error) {
		a, b := sim.New(1<<30), sim.New(2<<30)
		b.Number = 1
		return gpu.NewSet(gpu.Device{Index: 0, Backend: a}, gpu.Device{Index: 1, Backend: b})
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t.Setenv("VGPUHA_ENDPOINT", c.Endpoint)
	t.Setenv("VGPUHA_GPU", "1")
	d := New()
	if r := d.Init(0); r != Success {
		t.Fatalf("Init pinned to GPU 1: %d", r)
	}
	mem, r := d.DeviceTotalMem(0)
	if r != Success || mem != 2<<30 {
		t.Errorf("pinned to GPU 1, the program sees %d bytes (%d), UUID %s", mem, r, abi.UUIDString(d.dev.UUID))
	}
	d.Shutdown()
	t.Setenv("VGPUHA_GPU", "2")
	d = New()
	if r := d.Init(0); r != ErrorNoDevice {
		t.Errorf("Init pinned to GPU 2, which the node lacks: %d, want CUDA_ERROR_NO_DEVICE", r)
	}
	d.Shutdown()
}
