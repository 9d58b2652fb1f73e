// Package workload holds the example guest programs: each drives one library
// kernel through pvdriver and checks the result against a CPU reference
// computed the same way (same operation order, so results match bit for
// bit). The guest command, the demo, the tests and the drills all run these.
//
// Inputs are generated from a fixed seed, so a workload's checksum is the
// same on every run and every backend: a drill compares it with a
// fault-free run.
package workload

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"sort"
	"strings"

	"github.com/vgpuha/vgpuha/kernels"
	"github.com/vgpuha/vgpuha/pvdriver"
)

// Result is one workload's outcome.
type Result struct {
	Name     string `json:"name"`
	Verified bool   `json:"verified"`
	Checksum string `json:"checksum"`
	Size     int    `json:"size"`
	Detail   string `json:"detail,omitempty"`
}

// Workload is one example guest program. Size is its problem size: elements
// for the 1-D kernels, the matrix dimension for matmul, nodes for
// pointer_chase.
type Workload struct {
	Name        string
	DefaultSize int
	run         func(c *pvdriver.Client, size int) (out []byte, verified bool, detail string, err error)
}

var all = map[string]Workload{}

func add(w Workload) { all[w.Name] = w }

// Names lists the workloads, sorted.
func Names() []string {
	names := make([]string, 0, len(all))
	for n := range all {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Lookup returns the workload called name.
func Lookup(name string) (Workload, bool) {
	w, ok := all[name]
	return w, ok
}

// Select resolves a --workload flag: one name, or "all".
func Select(name string) ([]Workload, error) {
	if name == "all" {
		var ws []Workload
		for _, n := range Names() {
			ws = append(ws, all[n])
		}
		return ws, nil
	}
	var ws []Workload
	for _, n := range strings.Split(name, ",") {
		w, ok := all[n]
		if !ok {
			return nil, fmt.Errorf("unknown workload %q (have %v, a comma-separated list of them, and all)", n, Names())
		}
		ws = append(ws, w)
	}
	return ws, nil
}

// Run runs w with the given size (zero for its default). An error means the
// workload could not run; a wrong result is Verified false.
func (w Workload) Run(ctx context.Context, c *pvdriver.Client, size int) (Result, error) {
	if size <= 0 {
		size = w.DefaultSize
	}
	out, ok, detail, err := w.run(c, size)
	if err != nil {
		return Result{Name: w.Name, Size: size}, fmt.Errorf("workload %s: %w", w.Name, err)
	}
	h := fnv.New64a()
	h.Write(out)
	return Result{Name: w.Name, Verified: ok, Checksum: fmt.Sprintf("%016x", h.Sum64()), Size: size, Detail: detail}, nil
}

// rng is a small deterministic generator (splitmix64) for inputs.
type rng uint64

func (r *rng) next() uint64 {
	*r += 0x9e3779b97f4a7c15
	z := uint64(*r)
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

func f32bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func bytesf32(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

// kernel loads a one-kernel module and returns its function.
func kernel(c *pvdriver.Client, name string) (pvdriver.Function, error) {
	img, err := kernels.Image(name)
	if err != nil {
		return 0, err
	}
	m, err := c.LoadModule(img)
	if err != nil {
		return 0, err
	}
	return c.GetFunction(m, name)
}

// upload allocates device memory for b and copies it there on stream s.
func upload(c *pvdriver.Client, b []byte, s pvdriver.Stream) (pvdriver.DevicePtr, error) {
	p, err := c.Alloc(uint64(len(b)))
	if err != nil {
		return 0, err
	}
	return p, c.CopyHtoDAsync(p, b, s)
}

func download(c *pvdriver.Client, p pvdriver.DevicePtr, n int) ([]byte, error) {
	b := make([]byte, n)
	return b, c.CopyDtoH(b, p)
}

func blocks(n, per int) uint32 { return uint32((n + per - 1) / per) }

func firstMismatch[T comparable](got, want []T) string {
	if len(got) != len(want) {
		return fmt.Sprintf("got %d elements, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			return fmt.Sprintf("element %d: got %v, want %v", i, got[i], want[i])
		}
	}
	return ""
}

func check[T comparable](got, want []T) (bool, string) {
	if m := firstMismatch(got, want); m != "" {
		return false, m
	}
	return true, ""
}
