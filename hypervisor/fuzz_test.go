package hypervisor_test

import (
	"errors"
	"io"
	"net"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/kernels"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// framesFrom turns fuzz input into well-formed frames (so the fuzzer gets
// past the checksum and exercises request handling): each frame takes an
// opcode byte, a flags byte, a length byte and that many payload bytes.
func framesFrom(data []byte) []byte {
	out := hello(1)
	for id := uint64(2); len(data) >= 3; id++ {
		op, flags, n := abi.Opcode(int(data[0])%(len(abi.Opcodes())+1)), uint16(data[1]&3), int(data[2])
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
	vmm := seed(abi.OpAddressReserve, 0, &abi.AddressReserve{Size: 8 << 20})
	vmm = append(vmm, seed(abi.OpMemMap, 0, &abi.MemMap{Ptr: 0x7e0000000000, Size: 2 << 20})...)
	vmm = append(vmm, seed(abi.OpCopyHtoD, 0, &abi.CopyHtoD{Dst: 0x7e0000000000, Data: []byte{1, 2}})...)
	vmm = append(vmm, seed(abi.OpMemMap, 0, &abi.MemMap{Ptr: 0x7e0000200000, Size: 4 << 20})...)
	vmm = append(vmm, seed(abi.OpMemUnmap, 0, &abi.MemUnmap{Ptr: 0x7e0000000000, Size: 2 << 20})...)
	f.Add(append(vmm, seed(abi.OpAddressFree, 0, &abi.AddressFree{Ptr: 0x7e0000000000, Size: 8 << 20})...), false)
	f.Add(seed(abi.OpMemMap, 0, &abi.MemMap{Ptr: ^uint64(0) - 4095, Size: 1 << 21}), false) // wraps
	h, total := abi.HashImage(img), uint64(len(img))
	stage := seed(abi.OpImageStage, 0, &abi.ImageStage{Hash: h, Total: total, Data: img[:150]})
	stage = append(stage, seed(abi.OpImageStage, 0, &abi.ImageStage{Hash: h, Total: total, Offset: 150, Data: img[150:300]})...)
	stage = append(stage, seed(abi.OpImageStage, 0, &abi.ImageStage{Hash: h, Total: total, Offset: 100, Data: img[100:200]})...)
	f.Add(append(stage, seed(abi.OpModuleLoadCached, 0, &abi.ModuleLoadCached{Hash: h})...), false)
	f.Add([]byte("VGPU\x01\x00\x02\x00garbage"), true)
	f.Fuzz(func(t *testing.T, data []byte, raw bool) {
		backend := sim.New(64 << 20)
		cfg := hypervisor.DefaultConfig()
		cfg.MemoryQuota = 16 << 20
		reg := prometheus.NewRegistry()
		srv, err := hypervisor.NewServer(backend, cfg, reg, quietLog())
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
		if n := panicCount(t, reg); n != 0 {
			t.Fatalf("%d panics recovered: a handler has a bug", n)
		}
	})
}

// edges are the values where size arithmetic goes wrong: around 32- and
// 64-bit products, block limits, the allocation's edges.
var edges = []uint64{0, 1, 2, 3, 4, 31, 32, 33, 255, 256, 1023, 1024, 1025, 4095, 4096, 1 << 15, 65535, 65536,
	1<<31 - 1, 1 << 31, 1<<32 - 1, 1 << 32, 1<<62 - 1, 1 << 62, 1 << 63, ^uint64(0)}

func edge(sel uint8, raw uint64) uint64 {
	if sel < 128 {
		return edges[int(sel)%len(edges)]
	}
	return raw
}

// FuzzLaunch launches every library kernel through a guest session (the
// path a guest's launch takes: decode, handle and signature checks, the
// backend, the kernel's own arithmetic) with shapes and arguments drawn to
// hit size edge cases, against one 64 KiB allocation. Every launch must be
// answered (refused or faulted is fine), nothing may panic, and the guest's
// going frees everything.
func FuzzLaunch(f *testing.F) {
	names := kernels.Names()
	for i, n := range names {
		if n == "matmul" { // n = 2^31: 4·n·n bytes wraps to zero
			f.Add(uint8(i), uint8(1), uint8(1), uint8(1), uint8(1), uint32(0), []byte{0, 0, 0, 19}, uint64(0))
		}
	}
	f.Add(uint8(0), uint8(200), uint8(1), uint8(11), uint8(1), uint32(4096), []byte{0, 5, 0, 14}, uint64(4000))
	img, err := kernels.Image(names...)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, kernel, gx, gy, bx, by uint8, shared uint32, sels []byte, raw uint64) {
		backend, reg := sim.New(64<<20), prometheus.NewRegistry()
		srv, err := hypervisor.NewServer(backend, hypervisor.DefaultConfig(), reg, quietLog())
		if err != nil {
			t.Fatal(err)
		}
		guest, host := net.Pipe()
		done := make(chan struct{})
		go func() { srv.ServeConn(host); close(done) }()
		c, err := pvdriver.NewClient(guest, pvdriver.Options{GuestName: "fuzz"})
		if err != nil {
			t.Fatal(err)
		}
		p, err := c.Alloc(1 << 16)
		if err != nil {
			t.Fatal(err)
		}
		m, err := c.LoadModule(img)
		if err != nil {
			t.Fatal(err)
		}
		k, _ := kernels.Lookup(names[int(kernel)%len(names)])
		fn, err := c.GetFunction(m, k.Name)
		if err != nil {
			t.Fatal(err)
		}
		cfg := pvdriver.LaunchConfig{
			Grid:        abi.Dim3{X: uint32(edge(gx, raw)), Y: uint32(edge(gy, raw>>8)), Z: 1},
			Block:       abi.Dim3{X: uint32(edge(bx, raw>>16)), Y: uint32(edge(by, raw>>24)), Z: 1},
			SharedBytes: shared,
		}
		c.Launch(fn, cfg, launchArgs(k, uint64(p), sels, raw)...)
		if err := c.Synchronize(); err != nil && !errors.Is(err, pvdriver.ErrLaunchFailed) &&
			!errors.Is(err, pvdriver.ErrInvalidValue) && !errors.Is(err, pvdriver.ErrOutOfRange) {
			t.Fatalf("%s %+v: %v", k.Name, cfg, err)
		}
		c.Close()
		<-done
		if n := panicCount(t, reg); n != 0 {
			t.Fatalf("%d panics recovered: a kernel or handler has a bug", n)
		}
		if backend.Used() != 0 {
			t.Fatalf("%d device bytes held after the guest left", backend.Used())
		}
	})
}

// launchArgs draws a kernel's arguments: pointers at and around the 64 KiB
// allocation at p, integers at size edges.
func launchArgs(k *kernels.Kernel, p uint64, sels []byte, raw uint64) []abi.Arg {
	var args []abi.Arg
	for i, kind := range k.Params {
		var sel uint8
		if i < len(sels) {
			sel = sels[i]
		}
		v := raw*uint64(i+1) + uint64(i)
		switch kind {
		case abi.ArgPtr:
			ptrs := []uint64{p, p, p + 1<<16 - 4, p + 1<<16, p - 4, p + v%(1<<16), ^uint64(0) - v%16, v}
			args = append(args, abi.Ptr(ptrs[sel%8]))
		case abi.ArgU32:
			n := edge(sel, v)
			if k.Name == "pointer_chase" {
				n %= 1 << 12 // a zeroed allocation ends every chain at once; keep cycles short
			}
			args = append(args, abi.U32(uint32(n)))
		default:
			args = append(args, abi.Arg{Kind: kind, Bits: v})
		}
	}
	return args
}

// FuzzPinnedHello opens sessions on a node of two GPUs with arbitrary
// pins: each hello opens a session on a GPU the pin names, or is refused,
// nothing panics, and once the guest leaves every GPU counts no session
// and no promised memory.
func FuzzPinnedHello(f *testing.F) {
	for _, pin := range []string{"0", "3", "1", "GPU-76677075-6861-2d73-696d-000000000003", "gpu-7667", "GPU-", "-1", "99999999999999999999", "\x00"} {
		f.Add(pin, uint8(3))
	}
	f.Fuzz(func(t *testing.T, pin string, allocs uint8) {
		if pin == "" || len(pin) > abi.MaxGPUPinLen {
			return // not a pin the decoder passes on
		}
		devs := []gpu.Device{{Index: 0, Backend: sim.New(64 << 20)}, {Index: 3, Backend: sim.New(64 << 20)}}
		devs[1].Backend.(*sim.Backend).Number = 3
		set, _ := gpu.NewSet(devs...)
		reg := prometheus.NewRegistry()
		srv, err := hypervisor.NewServer(set, hypervisor.DefaultConfig(), reg, quietLog())
		if err != nil {
			t.Fatal(err)
		}
		guest, host := net.Pipe()
		done := make(chan struct{})
		go func() { srv.ServeConn(host); close(done) }()
		go io.Copy(io.Discard, guest)
		stream := abi.AppendFrame(nil, abi.OpHello, 0, 1, (&abi.Hello{GuestName: "pin", GPU: pin}).Append(nil))
		for id := range uint64(allocs % 8) {
			stream = abi.AppendFrame(stream, abi.OpAlloc, 0, id+2, (&abi.Alloc{Size: 1 << 20}).Append(nil))
		}
		guest.Write(stream)
		guest.Close()
		<-done
		for _, g := range srv.Status().GPUs {
			if g.Sessions != 0 || g.PromisedBytes != 0 || g.UsedBytes != 0 {
				t.Fatalf("after the guest left, GPU %d counts %+v", g.Index, g)
			}
		}
		if n := panicCount(t, reg); n != 0 {
			t.Fatalf("%d panics recovered", n)
		}
	})
}
