// Package kernels is the example kernel library: for every kernel, its
// parameter signature, its PTX source (what the CUDA backend loads) and a Go
// implementation (what the software GPU runs). The two are written to give
// bit-identical results: float arithmetic uses explicit .rn mul/add in PTX
// (never contracted to FMA) and explicit float32 conversions in Go, and
// reductions add in the same tree order.
//
// The package never touches memory except through the Memory it is given,
// which is the backend's bounds-checked view of one guest's allocations.
//
// Every argument comes from a guest. A kernel checks its launch against its
// signature before it runs (register wraps Run), and every byte count it
// derives from guest values goes through span, which refuses a product that
// overflows 64 bits: a wrapped count would ask Memory for a short view and
// the loop that follows would index past it. A bad launch is an ErrFault,
// never a panic.
package kernels

//go:generate go test -run TestPTXFiles -update

import (
	"errors"
	"fmt"
	"math/bits"
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
	// FollowsPointers: the kernel dereferences addresses it reads from
	// device memory, so it reaches memory its Footprint cannot name.
	FollowsPointers bool
	footprint       func(l Launch, dst []Extent) ([]Extent, error)
}

// Spec is the kernel's declaration in a module image.
func (k *Kernel) Spec() abi.KernelSpec {
	return abi.KernelSpec{Name: k.Name, Params: k.Params, PTX: k.PTX}
}

// ErrFault is wrapped by errors from a kernel that touched memory it does
// not own; the GPU equivalent is an illegal-address fault.
var ErrFault = errors.New("kernel memory fault")

// MaxBlockThreads bounds a block, as on every CUDA device of compute
// capability 2.0 and later (CUDA C++ Programming Guide, "Compute
// Capabilities", maximum number of threads per block).
const MaxBlockThreads = 1024

var library = map[string]*Kernel{}

// register adds k to the library, its Run guarded by checkLaunch.
func register(k *Kernel) {
	run := k.Run
	k.Run = func(mem Memory, l Launch) error {
		if err := k.checkLaunch(l); err != nil {
			return err
		}
		return run(mem, l)
	}
	library[k.Name] = k
}

// checkLaunch refuses a launch that does not match the kernel's signature
// or whose block no device runs: the implementations index their arguments
// and size per-block scratch memory from the block.
func (k *Kernel) checkLaunch(l Launch) error {
	if len(l.Args) != len(k.Params) {
		return fmt.Errorf("%w: %s takes %d arguments, launch gave %d", ErrFault, k.Name, len(k.Params), len(l.Args))
	}
	for i, a := range l.Args {
		if a.Kind != k.Params[i] {
			return fmt.Errorf("%w: %s argument %d has kind %d, want %d", ErrFault, k.Name, i, a.Kind, k.Params[i])
		}
	}
	if n := l.Block.Count(); n == 0 || n > MaxBlockThreads || l.Grid.Count() == 0 {
		return fmt.Errorf("%w: %s launched with grid %v and block %v", ErrFault, k.Name, l.Grid, l.Block)
	}
	return nil
}

// Lookup returns the library kernel called name.
func Lookup(name string) (*Kernel, bool) {
	k, ok := library[name]
	return k, ok
}

// IsLibrary reports whether spec declares one of the library's kernels
// exactly; anything else is a guest's own kernel.
func IsLibrary(spec abi.KernelSpec) bool {
	k, ok := library[spec.Name]
	return ok && k.Matches(spec)
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

// span is count elements of size bytes each, or a fault if that overflows
// 64 bits (matmul with n = 2^31 asks for 4·n·n bytes, exactly 2^64).
func span(count, size uint64, what string) (uint64, error) {
	hi, lo := bits.Mul64(count, size)
	if hi != 0 {
		return 0, fmt.Errorf("%w: %s: %d elements of %d bytes overflow 64 bits", ErrFault, what, count, size)
	}
	return lo, nil
}

// view returns count elements of size bytes at addr, all inside one
// allocation.
func view(mem Memory, addr, count, size uint64, what string) ([]byte, error) {
	n, err := span(count, size, what)
	if err != nil {
		return nil, err
	}
	b, err := mem.View(addr, n)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrFault, what, err)
	}
	if uint64(len(b)) != n { // a Memory that returned less than asked
		return nil, fmt.Errorf("%w: %s: %d-byte view for %d bytes", ErrFault, what, len(b), n)
	}
	return b, nil
}
