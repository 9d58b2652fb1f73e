package kernels

import (
	"math/rand/v2"
	"testing"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// recordingMemory hands out fresh zeroed bytes and remembers every view.
type recordingMemory struct{ views [][2]uint64 }

func (m *recordingMemory) View(addr, n uint64) ([]byte, error) {
	m.views = append(m.views, [2]uint64{addr, n})
	return make([]byte, n), nil
}

// TestFootprintCoversRun: for random launches of every library kernel, each
// view its Go twin takes lies inside the footprint the hypervisor checks
// (pointer_chase's later nodes excepted: it follows stored pointers).
func TestFootprintCoversRun(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, name := range Names() {
		k, _ := Lookup(name)
		checked := 0
		for i := 0; i < 200; i++ {
			l := randomLaunch(r, k)
			fp, err := k.Footprint(l, nil)
			if err != nil {
				continue
			}
			var mem recordingMemory
			if err := k.Run(&mem, l); err != nil {
				continue
			}
			checked++
			for vi, v := range mem.views {
				if k.FollowsPointers && vi > 0 && v[0] != l.Args[2].Bits {
					continue // a node reached through a stored pointer
				}
				if !covered(fp, l, v[0], v[1]) {
					t.Fatalf("%s %+v: Run viewed %d bytes at %#x outside its footprint %+v", name, l, v[1], v[0], fp)
				}
			}
		}
		if checked < 50 {
			t.Errorf("%s: only %d of 200 random launches ran", name, checked)
		}
	}
}

func covered(fp []Extent, l Launch, addr, n uint64) bool {
	for _, e := range fp {
		base := l.Args[e.Arg].Bits
		if addr >= base && addr-base <= e.Bytes && n <= e.Bytes-(addr-base) {
			return true
		}
	}
	return n == 0
}

// randomLaunch draws a small launch of k with distinct, far-apart pointers.
func randomLaunch(r *rand.Rand, k *Kernel) Launch {
	l := Launch{Grid: abi.Dim3{X: 1 + r.Uint32N(4), Y: 1 + r.Uint32N(3), Z: 1}, Block: abi.Dim3{X: 1 + r.Uint32N(32), Y: 1 + r.Uint32N(4), Z: 1}}
	l.SharedBytes = 4 * l.Block.X
	for i, kind := range k.Params {
		a := abi.Arg{Kind: kind}
		switch kind {
		case abi.ArgPtr:
			a.Bits = uint64(i+1) << 32
		case abi.ArgU32:
			a.Bits = uint64(r.Uint32N(80))
		default:
			a.Bits = uint64(r.Uint32())
		}
		l.Args = append(l.Args, a)
	}
	return l
}
