package worker_test

import (
	"testing"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/gpu/worker"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// BenchmarkHop is the cost of the worker's hop on the software GPU: each
// call in-process (inprocess) and through a worker (worker, each call
// answered; launches also pipelined, unanswered, and batched, held until
// the next call that is not one, as a session's are), side by side:
//
//	go test -run - -bench Hop ./hypervisor/gpu/worker
//
// new_context is a session's start-up: a context made in-process, or a
// worker taken (a spare) and replaced.
func BenchmarkHop(b *testing.B) {
	type backend struct {
		name string
		be   gpu.Backend
	}
	workers := simWorkers(b)
	backends := []backend{{"inprocess", sim.New(4 << 30)}, {"worker", workers}}
	inline := backend{"worker-inline", workers}       // every copy in the frame
	pipelined := backend{"worker-pipelined", workers} // launches unanswered
	batched := backend{"worker-batched", workers}     // and held until the next call that is not one
	const base = 1 << 40
	for _, op := range []struct {
		name      string
		bytes     int
		pipelined bool // also run with launches pipelined
		shm       bool // also run with the bytes in the frame
		run       func(b *testing.B, c gpu.Context, buf []byte, f gpu.Function)
	}{
		{"copy_htod/64B", 64, false, false, copyHtoD},
		{"copy_htod/4KiB", 4 << 10, false, false, copyHtoD},
		{"copy_htod/64KiB", 64 << 10, false, true, copyHtoD},
		{"copy_htod/1MiB", 1 << 20, false, true, copyHtoD},
		{"copy_dtoh/64B", 64, false, false, copyDtoH},
		{"copy_dtoh/4KiB", 4 << 10, false, false, copyDtoH},
		{"copy_dtoh/64KiB", 64 << 10, false, true, copyDtoH},
		{"copy_dtoh/1MiB", 1 << 20, false, true, copyDtoH},
		{"launch", 0, true, false, launch},
		{"alloc_free", 0, false, false, allocFree},
	} {
		bes := backends
		if op.pipelined {
			bes = append(bes, pipelined, batched)
		}
		if op.shm {
			bes = append(bes, inline)
		}
		for _, x := range bes {
			b.Run(op.name+"/"+x.name, func(b *testing.B) {
				c := newContext(b, x.be, base)
				defer c.Close()
				if x.name == inline.name {
					worker.SetInline(c, 1<<20)
				}
				if p, ok := c.(gpu.LaunchPipeliner); ok && (x.name == pipelined.name || x.name == batched.name) {
					p.PipelineLaunches()
				}
				if p, ok := c.(gpu.LaunchBatcher); ok && x.name == batched.name {
					p.BatchLaunches()
				}
				if err := c.Alloc(base, 4<<20); err != nil {
					b.Fatal(err)
				}
				f := loadKernel(b, c, "vadd")
				b.SetBytes(int64(op.bytes))
				b.ResetTimer()
				op.run(b, c, make([]byte, op.bytes), f)
				b.StopTimer()
				if err := c.Sync(); err != nil {
					b.Fatal(err)
				}
			})
		}
	}
	for _, x := range backends {
		b.Run("new_context/"+x.name, func(b *testing.B) {
			for b.Loop() {
				c, err := x.be.NewContext(base, 1<<30)
				if err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
		})
	}
}

func copyHtoD(b *testing.B, c gpu.Context, buf []byte, _ gpu.Function) {
	for b.Loop() {
		if err := c.CopyHtoD(1<<40, buf, 0); err != nil {
			b.Fatal(err)
		}
	}
}

func copyDtoH(b *testing.B, c gpu.Context, buf []byte, _ gpu.Function) {
	for b.Loop() {
		if err := c.CopyDtoH(buf, 1<<40, 0); err != nil {
			b.Fatal(err)
		}
	}
}

// launch adds two 32-element vectors (a launch whose work is small next
// to its call).
func launch(b *testing.B, c gpu.Context, _ []byte, f gpu.Function) {
	one, warp := abi.Dim3{X: 1, Y: 1, Z: 1}, abi.Dim3{X: 32, Y: 1, Z: 1}
	args := []abi.Arg{abi.Ptr(1 << 40), abi.Ptr(1<<40 + 4096), abi.Ptr(1<<40 + 8192), abi.U32(32)}
	for b.Loop() {
		if err := c.Launch(f, gpu.LaunchConfig{Grid: one, Block: warp}, args, 0); err != nil {
			b.Fatal(err)
		}
	}
}

func allocFree(b *testing.B, c gpu.Context, _ []byte, _ gpu.Function) {
	for b.Loop() {
		if err := c.Alloc(1<<40+8<<20, 2<<20); err != nil {
			b.Fatal(err)
		}
		if err := c.Free(1<<40 + 8<<20); err != nil {
			b.Fatal(err)
		}
	}
}
