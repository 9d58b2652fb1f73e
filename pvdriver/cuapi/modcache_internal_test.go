package cuapi

import (
	"encoding/binary"
	"math"
	"os"
	"testing"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// TestModuleCache: loads of one image share one node module: reloading
// after an unload (the module was parked) and loading while another handle
// holds it send no request, nor does a function lookup another handle made,
// and every handle's kernel runs; the last handle's unload parks it; a
// module whose variable the program asked for is not shared afterwards and
// is unloaded with its last handle; a PTX module that declares variables
// is never shared; the switch turns sharing off; a context's end unloads
// what it parked.
func TestModuleCache(t *testing.T) {
	d, th, ctx := driverWithContext(t)
	ptx, err := os.ReadFile("../../kernels/ptx/vadd.ptx")
	if err != nil {
		t.Fatal(err)
	}
	load := func() (m, f uint64) {
		t.Helper()
		m, r := d.ModuleLoadData(th, append(ptx, 0))
		if r != Success {
			t.Fatalf("ModuleLoadData: %d", r)
		}
		if f, r = d.ModuleGetFunction(m, "vadd"); r != Success {
			t.Fatalf("ModuleGetFunction: %d", r)
		}
		runVadd(t, d, th, f)
		return m, f
	}
	unload := func(m uint64) {
		t.Helper()
		if r := d.ModuleUnload(th, m); r != Success {
			t.Fatalf("ModuleUnload: %d", r)
		}
	}
	counts := func() [3]uint64 {
		n := sent(d, abi.OpModuleLoad, abi.OpGetFunction)
		u := sent(d, abi.OpModuleUnload, abi.OpModuleUnload)
		return [3]uint64{n[0], n[1], u[0]}
	}
	want := func(what string, w [3]uint64) {
		t.Helper()
		if got := counts(); got != w {
			t.Errorf("%s: %d loads, %d lookups, %d unloads sent in all; want %d, %d, %d", what, got[0], got[1], got[2], w[0], w[1], w[2])
		}
	}
	for range 10 {
		m, _ := load()
		unload(m)
	}
	want("10 loads, lookups and unloads of one image", [3]uint64{1, 1, 0})
	a, _ := load()
	b, fb := load() // while a holds it
	unload(a)
	runVadd(t, d, th, fb) // b's kernel runs on
	unload(b)
	want("two handles at once", [3]uint64{1, 1, 0})
	m, _ := load()
	if _, _, r := d.ModuleGetGlobal(m, "counter"); r != ErrorNotFound {
		t.Fatalf("ModuleGetGlobal of a name vadd lacks: %d", r)
	}
	other, _ := load() // the asked-for module is the program's: a new one
	unload(m)
	unload(other)
	want("a module whose variable was asked for", [3]uint64{2, 2, 1})
	if shareable(&module{globals: map[string]bool{"counter": true}}) || !shareable(&module{raw: true}) {
		t.Error("a PTX module that declares a variable is shared, or a cubin is not")
	}
	moduleCacheOff = true
	m, _ = load() // a module of its own, unloaded for real; the parked one stays
	unload(m)
	m, _ = load()
	unload(m)
	moduleCacheOff = false
	want("with sharing off", [3]uint64{4, 4, 3})
	m, _ = load() // the parked one again
	unload(m)
	d.mu.Lock()
	d.dropCtx(ctx)
	parked := len(d.shared)
	d.mu.Unlock()
	if got := counts(); got[2] != 4 || parked != 0 {
		t.Errorf("the context's end: %d unloads sent, %d modules still kept; want 4, 0", got[2], parked)
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
