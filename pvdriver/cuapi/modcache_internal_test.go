package cuapi

import (
	"encoding/binary"
	"math"
	"os"
	"testing"

	"github.com/vgpuha/vgpuha/internal/lab/cluster"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// TestModuleCache: a module the program unloads and loads again is taken
// back without a request, its function found by name without one, and it
// still runs; a module that declares a variable, or whose variable the
// program took, is not parked (its variables start afresh at a reload, as
// CUDA's do); the cache's switch turns parking off; a context's end
// unloads what it parked.
func TestModuleCache(t *testing.T) {
	c, err := cluster.Start(cluster.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t.Setenv("VGPUHA_ENDPOINT", c.Endpoint)
	d, th := New(), &stack{}
	if r := d.Init(0); r != Success {
		t.Fatalf("Init: %d", r)
	}
	defer d.Shutdown()
	ctx, r := d.CtxCreate(th, 0, 0, false)
	if r != Success {
		t.Fatalf("CtxCreate: %d", r)
	}
	ptx, err := os.ReadFile("../../kernels/ptx/vadd.ptx")
	if err != nil {
		t.Fatal(err)
	}
	cycle := func(img []byte, run bool) {
		t.Helper()
		m, r := d.ModuleLoadData(th, append(img, 0))
		if r != Success {
			t.Fatalf("ModuleLoadData: %d", r)
		}
		f, r := d.ModuleGetFunction(m, "vadd")
		if r != Success {
			t.Fatalf("ModuleGetFunction: %d", r)
		}
		if run { // the software GPU runs the library's own kernels only
			runVadd(t, d, th, f)
		}
		if r := d.ModuleUnload(th, m); r != Success {
			t.Fatalf("ModuleUnload: %d", r)
		}
	}
	counts := func() [3]uint64 {
		n := sent(d, abi.OpModuleLoad, abi.OpGetFunction)
		u := sent(d, abi.OpModuleUnload, abi.OpModuleUnload)
		return [3]uint64{n[0], n[1], u[0]}
	}
	for range 10 {
		cycle(ptx, true)
	}
	if got := counts(); got != [3]uint64{1, 1, 0} {
		t.Errorf("10 loads, lookups and unloads of one image: %d loads, %d lookups, %d unloads sent; want 1, 1, 0", got[0], got[1], got[2])
	}
	// A module that declares a variable, or whose variable the program
	// took, is not parked (the software GPU loads no such module, so the
	// decision is asked directly).
	d.mu.Lock()
	_, declared := d.park(0x10, &module{ctx: ctx, hash: abi.ImageHash{1}, globals: map[string]bool{"counter": true}, funcs: map[string]uint64{}})
	d.globals = map[uint64]moduleGlobal{0x7f00_0000_0000: {module: 0x20}}
	_, taken := d.park(0x20, &module{ctx: ctx, hash: abi.ImageHash{2}, raw: true, funcs: map[string]uint64{}})
	d.globals = nil
	d.mu.Unlock()
	if declared || taken {
		t.Errorf("parked a module that declares a variable (%v), one whose variable was taken (%v)", declared, taken)
	}
	moduleCacheOff = true
	cycle(ptx, true) // takes the parked one back, then unloads it for real
	cycle(ptx, true)
	moduleCacheOff = false
	if got := counts(); got != [3]uint64{2, 2, 2} {
		t.Errorf("with the cache off: %d loads, %d lookups, %d unloads sent in all; want 2, 2, 2", got[0], got[1], got[2])
	}
	cycle(ptx, true) // parked again
	d.mu.Lock()
	d.dropCtx(ctx)
	parked := len(d.parked)
	d.mu.Unlock()
	if got := counts(); got[2] != 3 || parked != 0 {
		t.Errorf("the context's end: %d unloads sent, %d modules still parked; want 3, 0", got[2], parked)
	}
}

// runVadd runs vadd (f) over 256 floats and checks c = a + b.
func runVadd(t *testing.T, d *Driver, th Thread, f uint64) {
	t.Helper()
	const n = 256
	var bufs [3]uint64
	for i := range bufs {
		p, r := d.MemAlloc(th, 4*n)
		if r != Success {
			t.Fatalf("MemAlloc: %d", r)
		}
		bufs[i] = p
		defer d.MemFree(th, p)
	}
	a, b := make([]byte, 4*n), make([]byte, 4*n)
	for i := range n {
		binary.LittleEndian.PutUint32(a[4*i:], math.Float32bits(float32(i)))
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(2))
	}
	if d.MemcpyHtoD(th, bufs[0], a, 0, false) != Success || d.MemcpyHtoD(th, bufs[1], b, 0, false) != Success {
		t.Fatal("MemcpyHtoD")
	}
	params := [][]byte{le64(bufs[0]), le64(bufs[1]), le64(bufs[2]), binary.LittleEndian.AppendUint32(nil, n)}
	l := Launch{Grid: [3]uint32{1, 1, 1}, Block: [3]uint32{n, 1, 1}}
	if r := d.LaunchKernel(th, f, l, params, nil); r != Success {
		t.Fatalf("LaunchKernel: %d", r)
	}
	out := make([]byte, 4*n)
	if r := d.MemcpyDtoH(th, out, bufs[2], 0); r != Success {
		t.Fatalf("MemcpyDtoH: %d", r)
	}
	for i := range n {
		if got := math.Float32frombits(binary.LittleEndian.Uint32(out[4*i:])); got != float32(i)+2 {
			t.Fatalf("c[%d] = %g, want %g", i, got, float32(i)+2)
		}
	}
}

func le64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }
