package hypervisor_test

import (
	"io"
	"log/slog"
	"net"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/internal/kernels"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// framesFrom turns fuzz input into well-formed frames (so the fuzzer gets
// past the checksum and exercises request handling): each frame takes an
// opcode byte, a flags byte, a length byte and that many payload bytes.
func framesFrom(data []byte) []byte {
	out := hello(1)
	for id := uint64(2); len(data) >= 3; id++ {
		op, flags, n := abi.Opcode(data[0]%20), uint16(data[1]&3), int(data[2])
		data = data[3:]
		n = min(n, len(data))
		out = abi.AppendFrame(out, op, flags, id, data[:n])
		data = data[n:]
	}
	return out
}

// FuzzServeConn drives one session with arbitrary requests: the hypervisor
// must never panic, must answer or drop the connection, and must free every
// byte of device memory when the guest goes away.
func FuzzServeConn(f *testing.F) {
	img, _ := kernels.Image("vadd")
	seed := func(op abi.Opcode, flags uint16, body abi.Body) []byte {
		b := body.Append(nil)
		return append([]byte{byte(op), byte(flags), byte(len(b))}, b...)
	}
	f.Add(append(seed(abi.OpAlloc, 0, &abi.Alloc{Size: 4096}),
		seed(abi.OpCopyHtoD, 0, &abi.CopyHtoD{Dst: 0x7e0000000000, Data: []byte{1, 2}})...), false)
	f.Add(seed(abi.OpModuleLoad, 0, &abi.ModuleLoad{Image: img[:200]}), false)
	f.Add(append(seed(abi.OpStreamCreate, 0, &abi.StreamCreate{}),
		seed(abi.OpLaunch, abi.FlagAsync, &abi.Launch{Function: 1, Grid: abi.Dim3{X: 1, Y: 1, Z: 1}, Block: abi.Dim3{X: 1, Y: 1, Z: 1}, Stream: 1})...), false)
	f.Add([]byte("VGPU\x01\x00\x02\x00garbage"), true)
	f.Fuzz(func(t *testing.T, data []byte, raw bool) {
		backend := sim.New(64 << 20)
		cfg := hypervisor.DefaultConfig()
		cfg.MemoryQuota = 16 << 20
		srv, err := hypervisor.NewServer(backend, cfg, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			t.Fatal(err)
		}
		guest, host := net.Pipe()
		done := make(chan struct{})
		go func() { srv.ServeConn(host); close(done) }()
		go io.Copy(io.Discard, guest)
		stream := framesFrom(data)
		if raw {
			stream = append(hello(1), data...)
		}
		guest.Write(stream)
		guest.Close()
		<-done
		if n := len(srv.Status().Sessions); n != 0 || backend.Used() != 0 {
			t.Fatalf("after the guest left: %d sessions, %d device bytes", n, backend.Used())
		}
	})
}
