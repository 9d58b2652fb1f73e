package cuapi

import (
	"encoding/binary"
	"os"
	"testing"
)

// BenchmarkLaunchKernel is the library's side of one cuLaunchKernel
// without the C entry (BenchmarkEntries in pvdriver/libcuda has that):
// checking the launch, building its request and sending it, pipelined, to
// a node on the software GPU over a unix socket.
func BenchmarkLaunchKernel(b *testing.B) {
	d, th, _ := driverWithContext(b)
	ptx, err := os.ReadFile("../../kernels/ptx/vadd.ptx")
	if err != nil {
		b.Fatal(err)
	}
	m, r := d.ModuleLoadData(th, append(ptx, 0))
	if r != Success {
		b.Fatalf("ModuleLoadData: %d", r)
	}
	f, r := d.ModuleGetFunction(m, "vadd")
	if r != Success {
		b.Fatalf("ModuleGetFunction: %d", r)
	}
	p, r := d.MemAlloc(th, 4096)
	if r != Success {
		b.Fatalf("MemAlloc: %d", r)
	}
	ptr := binary.LittleEndian.AppendUint64(nil, p)
	params := [][]byte{ptr, ptr, ptr, binary.LittleEndian.AppendUint32(nil, 256)}
	l := Launch{Grid: [3]uint32{1, 1, 1}, Block: [3]uint32{256, 1, 1}}
	b.ReportAllocs()
	for b.Loop() {
		if r := d.LaunchKernel(th, f, l, params, nil); r != Success {
			b.Fatalf("LaunchKernel: %d", r)
		}
	}
	if r := d.CtxSynchronize(th); r != Success {
		b.Fatalf("CtxSynchronize: %d", r)
	}
}
