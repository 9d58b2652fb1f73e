// Package kernels is the example kernel library: for every kernel, its
// parameter signature, its PTX source (what the CUDA backend loads) and a Go
// implementation (what the software GPU runs). The two are written to give
// bit-identical results: float arithmetic uses explicit .rn mul/add in PTX
// (never contracted to FMA) and explicit float32 conversions in Go, and
// reductions add in the same tree order.
//
// The package never touches memory except through the Memory it is given,
// which is the backend's bounds-checked view of one guest's allocations.
package kernels

//go:generate go test -run TestPTXFiles -update

import (
	"errors"
	"fmt"
	"sort"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Memory is one guest context's device memory as a kernel sees it.
type Memory interface {
	// View returns the n bytes at addr, which must lie inside one
	// allocation. Writes through the slice are writes to device memory.
	View(addr, n uint64) ([]byte, error)
}

// Launch is the shape and arguments of one kernel launch, already checked
// against the kernel's signature.
type Launch struct {
	Grid, Block abi.Dim3
	SharedBytes uint32
	Args        []abi.Arg
}

// Threads is the number of threads along x in the whole grid.
func (l Launch) Threads() uint64 { return uint64(l.Grid.X) * uint64(l.Block.X) }

// Kernel is one library kernel.
type Kernel struct {
	Name   string
	Params []abi.ArgKind
	PTX    string
	Run    func(mem Memory, l Launch) error
}

// Spec is the kernel's declaration in a module image.
func (k *Kernel) Spec() abi.KernelSpec {
	return abi.KernelSpec{Name: k.Name, Params: k.Params, PTX: k.PTX}
}

// ErrFault is wrapped by errors from a kernel that touched memory it does
// not own; the GPU equivalent is an illegal-address fault.
var ErrFault = errors.New("kernel memory fault")

var library = map[string]*Kernel{}

func register(k *Kernel) { library[k.Name] = k }

// Lookup returns the library kernel called name.
func Lookup(name string) (*Kernel, bool) {
	k, ok := library[name]
	return k, ok
}

// Names lists the library's kernels, sorted.
func Names() []string {
	names := make([]string, 0, len(library))
	for n := range library {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Image builds a module image holding the named library kernels.
func Image(names ...string) ([]byte, error) {
	var m abi.ModuleImage
	for _, n := range names {
		k, ok := library[n]
		if !ok {
			return nil, fmt.Errorf("kernels: no kernel %q in the library", n)
		}
		m.Kernels = append(m.Kernels, k.Spec())
	}
	return m.Append(nil), nil
}

// Matches reports whether spec declares exactly this library kernel: same
// signature and same PTX. A backend that runs the Go implementation must not
// run it in place of different PTX.
func (k *Kernel) Matches(spec abi.KernelSpec) bool {
	if spec.Name != k.Name || spec.PTX != k.PTX || len(spec.Params) != len(k.Params) {
		return false
	}
	for i := range spec.Params {
		if spec.Params[i] != k.Params[i] {
			return false
		}
	}
	return true
}

func view(mem Memory, addr, n uint64, what string) ([]byte, error) {
	b, err := mem.View(addr, n)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrFault, what, err)
	}
	return b, nil
}
