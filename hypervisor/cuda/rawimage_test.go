package cuda_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/internal/lab/cluster"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
)

// rawKernel has parameters of three sizes and alignments, so a wrong
// layout shows in its output.
const rawKernel = `struct pair { char c; double d; };
extern "C" __global__ void mix(float *out, pair p, float scale, unsigned n) {
	unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) out[i] = (float)(p.c + p.d) * scale + i;
}
`

// nvcc compiles rawKernel into each raw format, or skips the test.
func nvcc(t *testing.T) map[abi.ImageFormat][]byte {
	t.Helper()
	bin, err := exec.LookPath("nvcc")
	if err != nil {
		bin = "/usr/local/cuda/bin/nvcc"
	}
	if _, err := os.Stat(bin); err != nil {
		t.Skip("nvcc is missing: cubin and fatbin images cannot be built here")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "mix.cu")
	if err := os.WriteFile(src, []byte(rawKernel), 0o644); err != nil {
		t.Fatal(err)
	}
	images := map[abi.ImageFormat][]byte{}
	for format, flags := range map[abi.ImageFormat][]string{
		abi.FormatCubin:  {"-cubin", "-arch=sm_90"},
		abi.FormatFatbin: {"-fatbin", "-gencode", "arch=compute_90,code=[sm_90,compute_90]"},
	} {
		out := filepath.Join(dir, "mix."+format.String())
		if b, err := exec.Command(bin, append(flags, "-o", out, src)...).CombinedOutput(); err != nil {
			t.Fatalf("nvcc %v: %v\n%s", flags, err, b)
		}
		img, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		images[format] = img
	}
	return images
}

// TestRawImages: nvcc's cubin and fatbin, sent whole, load on a CUDA
// primary; the primary reports the parameter layout cuFuncGetParamInfo
// gives, a launch by it computes the right values, a launch with a
// wrong-sized argument and an unknown kernel name are refused. With a
// standby in the same process (its window at other addresses) the
// guest's own kernel cannot be replayed there: the standby must say so
// (unsafe, with the reason) instead of running it against the primary's
// addresses. Standbys in processes of their own get the same addresses:
// scripts/gpu-libcuda.sh checks that verify matches there.
func TestRawImages(t *testing.T) {
	backend(t)
	images := nvcc(t)
	newBackend := func() (gpu.Backend, error) { return backend(t), nil }
	for _, replicated := range []bool{false, true} {
		c, err := cluster.Start(cluster.Options{NewBackend: newBackend, OneGuestPerProcess: true,
			Replicate: replicated, StartStandby: replicated, Mode: replicate.ModeCommit})
		if err != nil {
			t.Fatal(err)
		}
		g, err := c.Guest("raw")
		if err != nil {
			t.Fatal(err)
		}
		for format, img := range images {
			t.Run(fmt.Sprintf("%v/replicated=%v", format, replicated), func(t *testing.T) { runRaw(t, g, format, img) })
		}
		if replicated {
			if err := c.WaitProtected(time.Minute); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Verify(); err != nil { // waits until the standby applied everything
				t.Fatal(err)
			}
			st := c.StandbyStatus()
			if !strings.Contains(fmt.Sprintf("%+v", st), "addresses differ") {
				t.Errorf("standby status does not say why the guest's kernel was not replayed: %+v", st)
			}
		}
		g.Close()
		c.Close()
	}
}

func runRaw(t *testing.T, g *pvdriver.Client, format abi.ImageFormat, img []byte) {
	wire, err := abi.RawImage(format, img)
	if err != nil {
		t.Fatal(err)
	}
	m, err := g.LoadModule(wire)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.GetFunction(m, "nosuch"); !errors.Is(err, abi.StatusInvalidValue) {
		t.Errorf("unknown kernel: %v, want invalid value", err)
	}
	f, err := g.GetFunction(m, "mix")
	if err != nil {
		t.Fatal(err)
	}
	slots, attrs, err := g.FunctionParams(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(attrs) < 7 || attrs[4] <= 0 || attrs[6] != 90 { // CU_FUNC_ATTRIBUTE_NUM_REGS, _BINARY_VERSION
		t.Errorf("attributes %v: want registers and binary version 90", attrs)
	}
	want := []abi.ParamSlot{{Offset: 0, Size: 8}, {Offset: 8, Size: 16}, {Offset: 24, Size: 4}, {Offset: 28, Size: 4}}
	if !slices.Equal(slots, want) {
		t.Fatalf("slots %v, want %v", slots, want)
	}
	const n = 256
	out, err := g.Alloc(4 * n)
	if err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	ptr, pair, scale, count := make([]byte, 8), make([]byte, 16), make([]byte, 4), make([]byte, 4)
	le.PutUint64(ptr, uint64(out))
	pair[0] = 3
	le.PutUint64(pair[8:], math.Float64bits(0.5))
	le.PutUint32(scale, math.Float32bits(2))
	le.PutUint32(count, n)
	cfg := pvdriver.LaunchConfig{Grid: pvdriver.Dim(1), Block: pvdriver.Dim(n)}
	if err := g.Launch(f, cfg, abi.Bytes(ptr), abi.Bytes(pair[:8]), abi.Bytes(scale), abi.Bytes(count)); err != nil {
		t.Fatal(err) // pipelined: the refusal comes with the next synchronization
	}
	if err := g.Synchronize(); !errors.Is(err, abi.StatusInvalidValue) {
		t.Errorf("short pair argument: %v, want invalid value", err)
	}
	if err := g.Launch(f, cfg, abi.Bytes(ptr), abi.Bytes(pair), abi.Bytes(scale), abi.Bytes(count)); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4*n)
	if err := g.CopyDtoH(got, out); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if v := math.Float32frombits(le.Uint32(got[4*i:])); v != float32(7+i) {
			t.Fatalf("%v: out[%d] = %v, want %v", format, i, v, 7+i)
		}
	}
}
