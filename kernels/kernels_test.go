package kernels

import (
	"errors"
	"fmt"
	"testing"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// arena is one allocation of device memory, bounds-checked the way the
// software GPU checks its views.
type arena struct {
	base uint64
	data []byte
}

func (a *arena) View(addr, n uint64) ([]byte, error) {
	if addr < a.base || addr-a.base >= uint64(len(a.data)) {
		return nil, fmt.Errorf("%#x is not inside the allocation", addr)
	}
	off := addr - a.base
	if n > uint64(len(a.data))-off {
		return nil, fmt.Errorf("%d bytes at %#x overrun the allocation", n, addr)
	}
	return a.data[off : off+n : off+n], nil
}

const arenaBase = 0x7e0000000000

func newArena(n int) *arena { return &arena{base: arenaBase, data: make([]byte, n)} }

// TestPoisonSizes: sizes whose byte counts overflow 64 bits fault instead of
// producing short views that the kernel then indexes past (matmul with
// n = 2^31 asks for 4·n·n = 2^64 bytes, which wraps to zero).
func TestPoisonSizes(t *testing.T) {
	mem := newArena(4096)
	p := abi.Ptr(arenaBase)
	one := abi.Dim3{X: 1, Y: 1, Z: 1}
	cases := []struct {
		kernel string
		l      Launch
	}{
		{"matmul", Launch{Grid: one, Block: one, Args: []abi.Arg{p, p, p, abi.U32(1 << 31)}}},
		{"matmul", Launch{Grid: one, Block: one, Args: []abi.Arg{p, p, p, abi.U32(1<<32 - 1)}}},
		{"matmul", Launch{Grid: abi.Dim3{X: 1 << 16, Y: 1 << 16, Z: 1}, Block: one, Args: []abi.Arg{p, p, p, abi.U32(1 << 16)}}},
		{"vadd", Launch{Grid: abi.Dim3{X: 1<<31 - 1, Y: 1, Z: 1}, Block: abi.Dim3{X: 1024, Y: 1, Z: 1}, Args: []abi.Arg{p, p, p, abi.U32(1<<32 - 1)}}},
		{"histogram", Launch{Grid: one, Block: one, Args: []abi.Arg{p, abi.U32(1), p, abi.U32(1<<32 - 1)}}},
		{"reduce_sum", Launch{Grid: abi.Dim3{X: 1<<32 - 1, Y: 1, Z: 1}, Block: one, SharedBytes: 4, Args: []abi.Arg{p, p, abi.U32(1)}}},
		{"reduce_sum", Launch{Grid: one, Block: abi.Dim3{X: 1 << 30, Y: 1, Z: 1}, SharedBytes: 1<<32 - 1, Args: []abi.Arg{p, p, abi.U32(1)}}},
		{"pointer_chase", Launch{Grid: one, Block: one, Args: []abi.Arg{abi.Ptr(^uint64(0) - 7), abi.U32(1), p}}},
		{"vadd", Launch{Grid: one, Block: one, Args: []abi.Arg{p, p}}},
		{"saxpy", Launch{Grid: one, Block: one, Args: []abi.Arg{p, p, p, abi.U32(1)}}},
	}
	for _, tc := range cases {
		k, _ := Lookup(tc.kernel)
		if err := k.Run(mem, tc.l); !errors.Is(err, ErrFault) {
			t.Errorf("%s %+v: got %v, want a fault", tc.kernel, tc.l, err)
		}
	}
}

func TestSpan(t *testing.T) {
	for _, tc := range []struct {
		count, size uint64
		ok          bool
	}{{1 << 62, 4, false}, {1<<62 - 1, 4, true}, {1 << 32, 1 << 32, false}, {1 << 31, 1 << 31, true}, {0, ^uint64(0), true}} {
		if _, err := span(tc.count, tc.size, "x"); (err == nil) != tc.ok {
			t.Errorf("span(%d, %d): %v", tc.count, tc.size, err)
		}
	}
}

// edges are the values where size arithmetic goes wrong: powers of two
// around 32-bit and 64-bit products, block sizes, the arena's edges.
var edges = []uint64{0, 1, 2, 3, 4, 31, 32, 33, 255, 256, 1023, 1024, 1025, 4095, 4096, 1 << 15, 65535, 65536,
	1<<31 - 1, 1 << 31, 1<<32 - 1, 1 << 32, 1<<62 - 1, 1 << 62, 1 << 63, ^uint64(0)}

// edge picks a value: an edge (sel < 128) or the raw fuzz value.
func edge(sel uint8, raw uint64) uint64 {
	if sel < 128 {
		return edges[int(sel)%len(edges)]
	}
	return raw
}

// ptrEdge picks a pointer around the arena: its start, its end, just
// inside or outside either, wrapped, or raw.
func ptrEdge(sel uint8, raw uint64) uint64 {
	const size = 1 << 16
	switch sel % 8 {
	case 0, 1:
		return arenaBase
	case 2:
		return arenaBase + size - 4
	case 3:
		return arenaBase + size
	case 4:
		return arenaBase - 4
	case 5:
		return arenaBase + raw%size
	case 6:
		return ^uint64(0) - raw%16
	}
	return raw
}

// FuzzKernels runs every library kernel with shapes and arguments drawn to
// hit size edge cases against one 64 KiB allocation: a kernel returns nil or
// ErrFault and never panics, and a faulting kernel writes nothing.
func FuzzKernels(f *testing.F) {
	names := Names()
	idx := func(name string) uint8 {
		for i, n := range names {
			if n == name {
				return uint8(i)
			}
		}
		panic(name)
	}
	f.Add(idx("matmul"), uint8(1), uint8(1), uint8(1), uint8(1), uint32(0), []byte{0, 0, 0, 19}, uint64(0)) // n = 2^31
	f.Add(idx("vadd"), uint8(200), uint8(1), uint8(200), uint8(1), uint32(0), []byte{0, 0, 0, 200}, uint64(64))
	f.Add(idx("reduce_sum"), uint8(5), uint8(1), uint8(9), uint8(1), uint32(4096), []byte{0, 0, 200}, uint64(1000))
	f.Fuzz(func(t *testing.T, kernel, gx, gy, bx, by uint8, shared uint32, sels []byte, raw uint64) {
		k, _ := Lookup(names[int(kernel)%len(names)])
		l := Launch{
			Grid:        abi.Dim3{X: uint32(edge(gx, raw)), Y: uint32(edge(gy, raw>>8)), Z: 1},
			Block:       abi.Dim3{X: uint32(min(edge(bx, raw>>16), 2048)), Y: uint32(min(edge(by, raw>>24), 2048)), Z: 1},
			SharedBytes: shared,
		}
		for i, kind := range k.Params {
			var sel uint8
			if i < len(sels) {
				sel = sels[i]
			}
			v := raw*uint64(i+1) + uint64(i)
			switch kind {
			case abi.ArgPtr:
				l.Args = append(l.Args, abi.Ptr(ptrEdge(sel, v)))
			case abi.ArgU32:
				n := edge(sel, v)
				if k.Name == "pointer_chase" {
					n %= 1 << 12 // a zeroed arena ends every chain at once; keep cycles short
				}
				l.Args = append(l.Args, abi.U32(uint32(n)))
			default:
				l.Args = append(l.Args, abi.Arg{Kind: kind, Bits: v})
			}
		}
		mem := newArena(1 << 16)
		err := k.Run(mem, l)
		if err != nil && !errors.Is(err, ErrFault) {
			t.Fatalf("%s: error %v is not a fault", k.Name, err)
		}
		if err != nil {
			for _, b := range mem.data {
				if b != 0 {
					t.Fatalf("%s faulted after writing memory", k.Name)
				}
			}
		}
	})
}
