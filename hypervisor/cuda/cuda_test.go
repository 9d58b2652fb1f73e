package cuda_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/hypervisor/cuda"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/internal/lab/cluster"
	"github.com/vgpuha/vgpuha/internal/lab/workload"
	"github.com/vgpuha/vgpuha/kernels"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

func backend(t *testing.T) *cuda.Backend {
	t.Helper()
	b, err := cuda.New(0)
	if errors.Is(err, cuda.ErrNoDriver) {
		t.Skipf("no NVIDIA driver here (%v); run `make gpu-test` on a machine with a GPU", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("device: %s", b.Device())
	return b
}

func run(t *testing.T, newBackend func() (gpu.Backend, error)) map[string]string {
	t.Helper()
	// One guest per process: pointer_chase follows stored pointers, which a
	// GPU does not check, so it runs only there.
	c, err := cluster.Start(cluster.Options{NewBackend: newBackend, OneGuestPerProcess: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	g, err := c.Guest("cuda-test")
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	sums := map[string]string{}
	ws, _ := workload.Select("all")
	for _, w := range ws {
		r, err := w.Run(context.Background(), g, 0)
		if err != nil {
			t.Fatal(err)
		}
		if !r.Verified {
			t.Errorf("%s on %T: %s", r.Name, newBackend, r.Detail)
		}
		sums[r.Name] = r.Checksum
	}
	return sums
}

// TestWorkloadsMatchSim: every workload verifies on the GPU, and its output
// is bit-identical to the software GPU's: the kernel library's Go and PTX
// implementations agree exactly.
func TestWorkloadsMatchSim(t *testing.T) {
	b := backend(t)
	onGPU := run(t, func() (gpu.Backend, error) { return b, nil })
	onSim := run(t, func() (gpu.Backend, error) { return sim.New(1 << 30), nil })
	for name, sum := range onSim {
		if onGPU[name] != sum {
			t.Errorf("%s: GPU checksum %s, software GPU %s", name, onGPU[name], sum)
		}
	}
}

// TestWindowAtRequestedBase: the VA window lands at the requested base,
// allocations map there, and freeing returns the memory.
// TestWindowOfAnySize: a window whose size is not a whole number of the
// driver's granules (bench pv asked for 1 GiB + 1 MiB) is reserved, not
// refused with INVALID_VALUE.
func TestWindowOfAnySize(t *testing.T) {
	b := backend(t)
	ctx, err := b.NewContext(0x7d0000000000, 1<<30+1<<20)
	if err != nil {
		t.Fatal(err)
	}
	ctx.Close()
}

func TestWindowAtRequestedBase(t *testing.T) {
	b := backend(t)
	const base, size = 0x7e0000000000, 1 << 30
	ctx, err := b.NewContext(base, size)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	got, _ := ctx.Window()
	t.Logf("asked for %#x, got %#x", uint64(base), got)
	if got != base {
		t.Skipf("driver placed the window elsewhere (%#x): translation would be used", got)
	}
	for i := 0; i < 3; i++ { // alloc/free cycles must not leak
		if err := ctx.Alloc(base, 256<<20); err != nil {
			t.Fatal(err)
		}
		if err := ctx.CopyHtoD(base+100, []byte{1, 2, 3}, 0); err != nil {
			t.Fatal(err)
		}
		out := make([]byte, 3)
		if err := ctx.CopyDtoH(out, base+100, 0); err != nil || out[2] != 3 {
			t.Fatalf("read back %v, %v", out, err)
		}
		if err := ctx.Free(base); err != nil {
			t.Fatal(err)
		}
	}
}

// TestChecksumOnGPU: the device computes exactly gpu.Checksum.
func TestChecksumOnGPU(t *testing.T) {
	b := backend(t)
	ctx, err := b.NewContext(0x7d0000000000, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	base, _ := ctx.Window()
	data := make([]byte, 10<<20+5)
	for i := range data {
		data[i] = byte(i*131 + i>>9)
	}
	if err := ctx.Alloc(base, 12<<20); err != nil {
		t.Fatal(err)
	}
	if err := ctx.CopyHtoD(base, data, 0); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, 3, 8, 4096, len(data)} {
		got, err := ctx.(gpu.Checksummer).Checksum(base, uint64(n))
		if err != nil {
			t.Fatal(err)
		}
		if want := gpu.Checksum(data[:n]); got != want {
			t.Errorf("%d bytes: GPU %#x, host %#x", n, got, want)
		}
	}
}

// TestMemorySnapshotOnGPU: a snapshot reads back the contents it was taken
// with after the guest overwrote them (copy, memset, DtoD).
func TestMemorySnapshotOnGPU(t *testing.T) {
	b := backend(t)
	ctx, err := b.NewContext(0x7d0000000000, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	const n = 6 << 20
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(i*7 + i>>11)
	}
	base, snap := snapshotOf(t, ctx, data, 8<<20)
	defer snap.Release()
	if err := ctx.Memset(base, 4, 0xdeadbeef, n/8, 0); err != nil {
		t.Fatal(err)
	}
	if err := ctx.CopyDtoD(base+n/2, base, n/2, 0); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, n)
	for off := 0; off < n; off += 1 << 20 {
		if err := snap.ReadAt(got[off:off+1<<20], base+uint64(off)); err != nil {
			t.Fatal(err)
		}
	}
	if string(got) != string(data) {
		t.Fatal("the snapshot does not hold the contents it was taken with")
	}
}

// snapshotOf allocates alloc bytes at the start of ctx's window, writes
// data there and takes a memory snapshot of it.
func snapshotOf(t *testing.T, ctx gpu.Context, data []byte, alloc uint64) (uint64, gpu.MemorySnapshot) {
	t.Helper()
	base, _ := ctx.Window()
	if err := ctx.Alloc(base, alloc); err != nil {
		t.Fatal(err)
	}
	if err := ctx.CopyHtoD(base, data, 0); err != nil {
		t.Fatal(err)
	}
	snap, err := ctx.(gpu.Snapshotter).SnapshotMemory([]gpu.Range{{Addr: base, Size: uint64(len(data))}})
	if err != nil {
		t.Fatal(err)
	}
	return base, snap
}

// TestSnapshotReadsBesideGuestAndRelease: reads of a snapshot run while
// the guest copies, and while the snapshot (then the context) goes away:
// every read returns the snapshot's bytes or says it was released,
// and release waits for the reads under way.
func TestSnapshotReadsBesideGuestAndRelease(t *testing.T) {
	b := backend(t)
	ctx, err := b.NewContext(0x7d0000000000, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	const n = 64 << 20
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(i*13 + i>>17)
	}
	base, snap := snapshotOf(t, ctx, data, n)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got := make([]byte, 4<<20)
			for i := 0; ; i++ {
				off := uint64((w*7+i)%16) * uint64(len(got))
				err := snap.ReadAt(got, base+off)
				if err != nil && strings.Contains(err.Error(), "snapshot released") {
					return
				}
				if err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(got, data[off:off+uint64(len(got))]) {
					errs <- fmt.Errorf("a read at +%d returned other bytes than the snapshot's", off)
					return
				}
			}
		}()
	}
	zero := make([]byte, 1<<20)
	for i := range 32 { // the guest writes meanwhile
		if err := ctx.CopyHtoD(base+uint64(i)<<20, zero, 0); err != nil {
			t.Fatal(err)
		}
	}
	snap.Release()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := ctx.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestOverlappingCopyIsMemmove: a device-to-device copy whose source and
// destination overlap leaves what memmove would (as on the software GPU),
// every time: CUDA leaves such a copy undefined, and a replica that
// replayed one differed from its primary. Shifts below and above the
// staging buffer's size, in both directions, each copy repeated on the
// same starting bytes.
func TestOverlappingCopyIsMemmove(t *testing.T) {
	const size = 64 << 20
	backends := []gpu.Backend{sim.New(1 << 30)} // the reference, and a check of the test
	if b, err := cuda.New(0); err == nil {
		backends = append(backends, b)
	} else {
		t.Logf("no CUDA here (%v): the software GPU only", err)
	}
	for _, gb := range backends {
		ctx, err := gb.NewContext(0x7d0000000000, 1<<30)
		if err != nil {
			t.Fatal(err)
		}
		base, _ := ctx.Window()
		if err := ctx.Alloc(base, size); err != nil {
			t.Fatal(err)
		}
		start := make([]byte, size)
		for i := range start {
			start[i] = byte(i*7 + i>>12)
		}
		for _, c := range []struct{ dst, src, n uint64 }{
			{8, 0, 40 << 20}, {0, 8, 40 << 20}, {3 << 20, 0, 48 << 20}, {0, 5 << 20, 48 << 20},
			{1, 0, 9 << 20}, {16 << 20, 15 << 20, 1 << 20},
		} {
			want := bytes.Clone(start)
			copy(want[c.dst:c.dst+c.n], want[c.src:c.src+c.n])
			for try := range 3 {
				got := make([]byte, size)
				if err := ctx.CopyHtoD(base, start, 0); err != nil {
					t.Fatal(err)
				}
				if err := ctx.CopyDtoD(base+c.dst, base+c.src, c.n, 0); err != nil {
					t.Fatal(err)
				}
				if err := ctx.CopyDtoH(got, base, 0); err != nil {
					t.Fatal(err)
				}
				if i := firstDiff(got, want); i >= 0 {
					t.Fatalf("%s: copy of %d bytes from +%d to +%d, try %d: byte %d is %#x, memmove gives %#x", gb.Name(), c.n, c.src, c.dst, try, i, got[i], want[i])
				}
			}
		}
		ctx.Close()
	}
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// BenchmarkReplicaSetup times what a standby does on the GPU to recreate
// one session from a resync snapshot, step by step: a context with its
// window, two 64 MiB allocations, the library's module (its PTX compiled
// by the driver), 64 MiB of contents in 4 MiB copies from ordinary
// memory, and the context's end. Reported in ms per step.
func BenchmarkReplicaSetup(b *testing.B) {
	cb, err := cuda.New(0)
	if err != nil {
		b.Skipf("no CUDA here: %v", err)
	}
	img := libraryImage(b, "pointer_chase")
	piece := make([]byte, 4<<20)
	steps := []string{"context", "alloc-2x64MiB", "module", "htod-64MiB", "close"}
	took := make([]time.Duration, len(steps))
	for range b.N {
		t0 := time.Now()
		mark := func(i int) { took[i] += time.Since(t0); t0 = time.Now() }
		ctx, err := cb.NewContext(0x7d0000000000, 1<<30)
		if err != nil {
			b.Fatal(err)
		}
		mark(0)
		base, _ := ctx.Window()
		for i := range uint64(2) {
			if err := ctx.Alloc(base+i<<26, 64<<20); err != nil {
				b.Fatal(err)
			}
		}
		mark(1)
		m, err := ctx.LoadModule(img)
		if err == nil {
			_, err = ctx.Function(m, "pointer_chase")
		}
		if err != nil {
			b.Fatal(err)
		}
		mark(2)
		for off := uint64(0); off < 64<<20; off += uint64(len(piece)) {
			if err := ctx.CopyHtoD(base+off, piece, 0); err != nil {
				b.Fatal(err)
			}
		}
		mark(3)
		if err := ctx.Close(); err != nil {
			b.Fatal(err)
		}
		mark(4)
	}
	for i, s := range steps {
		b.ReportMetric(float64(took[i].Microseconds())/1e3/float64(b.N), s+"-ms")
	}
}

// TestPipelinedLaunches: with launches pipelined (gpu.LaunchPipeliner),
// kernels queued between copies and memsets that feed on each other leave
// exactly what the same calls leave made inline, and on the software GPU:
// the context's calls reach the driver in order. A launch the driver
// refuses when the launcher submits it does not fail the calls after it;
// the next Sync reports it, once.
func TestPipelinedLaunches(t *testing.T) {
	b := backend(t)
	inline := chain(t, b, false)
	if got := chain(t, b, true); !bytes.Equal(got, inline) {
		t.Fatalf("pipelined launches left other bytes than inline ones (first differing byte %d)", firstDiff(got, inline))
	}
	if onSim := chain(t, sim.New(1<<30), false); !bytes.Equal(onSim, inline) {
		t.Fatalf("the GPU and the software GPU differ (first differing byte %d)", firstDiff(onSim, inline))
	}

	ctx, f, base := vaddContext(t, b)
	ctx.(gpu.LaunchPipeliner).PipelineLaunches()
	args := []abi.Arg{abi.Ptr(base), abi.Ptr(base + 4096), abi.Ptr(base + 8192), abi.U32(256)}
	tooWide := gpu.LaunchConfig{Grid: abi.Dim3{X: 1, Y: 1, Z: 1}, Block: abi.Dim3{X: 4096, Y: 1, Z: 1}}
	if err := ctx.Launch(f, tooWide, args, 0); err != nil {
		t.Fatalf("a queued launch failed at once: %v", err)
	}
	if err := ctx.Memset(base, 4, 7, 1024, 0); err != nil {
		t.Fatalf("a memset after a refused launch: %v", err)
	}
	word := make([]byte, 4)
	if err := ctx.CopyDtoH(word, base+4092, 0); err != nil || binary.LittleEndian.Uint32(word) != 7 {
		t.Fatalf("the memset after a refused launch: %v, word %x", err, word)
	}
	if err := ctx.Sync(); err == nil || !strings.Contains(err.Error(), "cuLaunchKernel") {
		t.Fatalf("Sync after a refused launch: %v, want the launch's error", err)
	}
	if err := ctx.Sync(); err != nil {
		t.Fatalf("a second Sync reported it again: %v", err)
	}
}

// vaddContext makes a context holding three pages and vadd.
func vaddContext(t *testing.T, b gpu.Backend) (gpu.Context, gpu.Function, uint64) {
	t.Helper()
	ctx, err := b.NewContext(0x7d0000000000, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctx.Close() })
	base, _ := ctx.Window()
	if err := ctx.Alloc(base, 2<<20); err != nil {
		t.Fatal(err)
	}
	m, err := ctx.LoadModule(libraryImage(t, "vadd"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := ctx.Function(m, "vadd")
	if err != nil {
		t.Fatal(err)
	}
	return ctx, f, base
}

// chain runs 300 rounds of vadd, each feeding the next through a
// device-to-device copy, with memsets and copies in between, and returns
// the three vectors.
func chain(t *testing.T, b gpu.Backend, pipelined bool) []byte {
	ctx, f, base := vaddContext(t, b)
	if pipelined {
		ctx.(gpu.LaunchPipeliner).PipelineLaunches()
	}
	a, bv, c := base, base+4096, base+8192
	init := make([]byte, 4096)
	for i := range 1024 {
		binary.LittleEndian.PutUint32(init[4*i:], math.Float32bits(float32(i)/8))
	}
	for _, p := range []uint64{a, bv} {
		if err := ctx.CopyHtoD(p, init, 0); err != nil {
			t.Fatal(err)
		}
	}
	cfg := gpu.LaunchConfig{Grid: abi.Dim3{X: 4, Y: 1, Z: 1}, Block: abi.Dim3{X: 256, Y: 1, Z: 1}}
	for r := range 300 {
		if err := ctx.Launch(f, cfg, []abi.Arg{abi.Ptr(a), abi.Ptr(bv), abi.Ptr(c), abi.U32(1024)}, 0); err != nil {
			t.Fatal(err)
		}
		if err := ctx.CopyDtoD(a, c, 4096, 0); err != nil {
			t.Fatal(err)
		}
		if r%7 == 0 {
			if err := ctx.Memset(bv+uint64(4*r), 4, math.Float32bits(float32(r)), 64, 0); err != nil {
				t.Fatal(err)
			}
		}
		if r%50 == 0 {
			if err := ctx.CopyHtoD(bv+2048, init[:1024], 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := ctx.Sync(); err != nil {
		t.Fatal(err)
	}
	out := make([]byte, 3*4096)
	if err := ctx.CopyDtoH(out, a, 0); err != nil {
		t.Fatal(err)
	}
	return out
}

// libraryImage is the kernel library's module image holding kernel.
func libraryImage(tb testing.TB, kernel string) *abi.ModuleImage {
	tb.Helper()
	raw, err := kernels.Image(kernel)
	if err != nil {
		tb.Fatal(err)
	}
	img, err := abi.DecodeModuleImage(raw)
	if err != nil {
		tb.Fatal(err)
	}
	return img
}

// TestQueuedCopiesKeepOrder: copies a replica leaves queued
// (gpu.QueuedCopier), from page-locked buffers, on the null stream and on
// a stream of the context's, land in order with the memsets and
// device-to-device copies around them; once their mark is settled the
// buffers may be reused without changing what the device holds.
func TestQueuedCopiesKeepOrder(t *testing.T) {
	b := backend(t)
	ctx, err := b.NewContext(0x7d4000000000, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	q := ctx.(gpu.QueuedCopier)
	base, _ := ctx.Window()
	const size, piece = 32 << 20, 1 << 20
	if err := ctx.Alloc(base, size); err != nil {
		t.Fatal(err)
	}
	st, err := ctx.CreateStream()
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, size)
	src, err := b.AllocHost(size)
	if err != nil {
		t.Fatal(err)
	}
	for round := range 4 {
		if err := ctx.Memset(base, 1, uint32(round), size, 0); err != nil {
			t.Fatal(err)
		}
		for i := range want {
			want[i] = byte(round)
		}
		for off := 0; off < size; off += 2 * piece {
			s := gpu.Stream(0)
			if off/(2*piece)%2 == 1 {
				s = st
			}
			chunk := src[off : off+piece]
			for i := range chunk {
				chunk[i] = byte(i*3 + off>>20 + round)
			}
			if err := q.QueueCopyHtoD(base+uint64(off), chunk, s); err != nil {
				t.Fatal(err)
			}
			copy(want[off:], chunk)
			// the next piece: a device copy of this one, after it
			if err := ctx.CopyDtoD(base+uint64(off+piece), base+uint64(off), piece, s); err != nil {
				t.Fatal(err)
			}
			copy(want[off+piece:], chunk)
		}
		// two marks, the second with nothing new queued: settling the
		// first waits for every copy
		if err := q.Mark(uint64(2*round + 1)); err != nil {
			t.Fatal(err)
		}
		if err := q.Mark(uint64(2*round + 2)); err != nil {
			t.Fatal(err)
		}
		if err := q.Settle(uint64(2*round + 1)); err != nil {
			t.Fatal(err)
		}
		for i := range src {
			src[i] = 0xee // reused once settled: the device keeps what was copied
		}
		got := make([]byte, size)
		if err := ctx.CopyDtoH(got, base, 0); err != nil {
			t.Fatal(err)
		}
		if i := firstDiff(got, want); i >= 0 {
			t.Fatalf("round %d: byte %d is %#x, want %#x", round, i, got[i], want[i])
		}
	}
}
