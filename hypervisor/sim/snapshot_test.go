package sim

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/kernels"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// TestMemorySnapshotCopyOnWrite: a snapshot read out in random pieces,
// while copies, memsets, device-to-device copies, kernels and a free
// change the memory between the reads, gives exactly the bytes of the
// moment it was taken.
func TestMemorySnapshotCopyOnWrite(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		ctx, err := New(64<<20).NewContext(1<<32, 1<<30)
		if err != nil {
			t.Fatal(err)
		}
		c := ctx.(*guestContext)
		sizes := []uint64{3*cowPage + 1234, cowPage, 5*cowPage - 8}
		var addrs []uint64
		want := map[uint64][]byte{}
		for i, n := range sizes {
			addr := uint64(1<<32) + uint64(i)<<24
			must(t, c.Alloc(addr, n))
			b := make([]byte, n)
			for j := range b {
				b[j] = byte(rng.Uint32())
			}
			must(t, c.CopyHtoD(addr, b, 0))
			addrs, want[addr] = append(addrs, addr), b
		}
		fn := chaseFunction(t, c)
		var ranges []gpu.Range
		for i, a := range addrs {
			ranges = append(ranges, gpu.Range{Addr: a, Size: sizes[i]})
		}
		snap, err := c.SnapshotMemory(ranges)
		if err != nil {
			t.Fatal(err)
		}
		whole := seed%2 == 0 // read in page-sized pieces, as a resync does
		for i, a := range addrs {
			got := make([]byte, 0, sizes[i])
			for uint64(len(got)) < sizes[i] {
				scribble(t, c, rng, addrs, sizes, fn)
				n := min(sizes[i]-uint64(len(got)), 1+rng.Uint64N(2*cowPage))
				if whole {
					n = min(sizes[i]-uint64(len(got)), cowPage)
				}
				piece := make([]byte, n)
				must(t, snap.ReadAt(piece, a+uint64(len(got))))
				got = append(got, piece...)
			}
			if !bytes.Equal(got, want[a]) {
				t.Fatalf("seed %d: allocation %#x read back from the snapshot differs from its contents when taken", seed, a)
			}
		}
		if whole && len(c.snap.allocs[0].kept)+len(c.snap.allocs[1].kept) != 0 {
			t.Errorf("seed %d: pages read out whole are still kept", seed)
		}
		snap.Release()
		if err := snap.ReadAt(make([]byte, 1), addrs[0]); err == nil {
			t.Error("a released snapshot still reads")
		}
		for i := range c.allocs {
			if c.allocs[i].cow != nil {
				t.Error("a released snapshot still copies on write")
			}
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// chaseFunction loads pointer_chase, the kernel that follows pointers it
// reads from device memory.
func chaseFunction(t *testing.T, c *guestContext) gpu.Function {
	raw, err := kernels.Image("pointer_chase")
	if err != nil {
		t.Fatal(err)
	}
	img, err := abi.DecodeModuleImage(raw)
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.LoadModule(img)
	if err != nil {
		t.Fatal(err)
	}
	fn, err := c.Function(m, "pointer_chase")
	if err != nil {
		t.Fatal(err)
	}
	return fn
}

// scribble makes one random write of a random kind (the last allocation
// may be freed instead, once).
func scribble(t *testing.T, c *guestContext, rng *rand.Rand, addrs, sizes []uint64, chase gpu.Function) {
	i := rng.IntN(2) // the first two stay allocated
	n := 1 + rng.Uint64N(sizes[i]/2)
	at := addrs[i] + rng.Uint64N(sizes[i]-n+1)
	switch rng.IntN(5) {
	case 0:
		must(t, c.CopyHtoD(at, bytes.Repeat([]byte{byte(rng.Uint32())}, int(n)), 0))
	case 1:
		must(t, c.Memset(at, 1, rng.Uint32(), n, 0))
	case 2:
		j := rng.IntN(2)
		src := addrs[j] + rng.Uint64N(sizes[j]-n+1)
		if n <= sizes[j] {
			must(t, c.CopyDtoD(at, src, n, 0))
		}
	case 3: // a node {next, value} in allocation 0, chased; the result lands in allocation 1
		node := binary.LittleEndian.AppendUint64(nil, addrs[0])
		must(t, c.CopyHtoD(addrs[0], binary.LittleEndian.AppendUint64(node, 5), 0))
		out := addrs[1] + 16*rng.Uint64N(sizes[1]/16)
		args := []abi.Arg{{Kind: abi.ArgPtr, Bits: addrs[0]}, {Kind: abi.ArgU32, Bits: 3}, {Kind: abi.ArgPtr, Bits: out}}
		must(t, c.Launch(chase, gpu.LaunchConfig{Grid: abi.Dim3{X: 1, Y: 1, Z: 1}, Block: abi.Dim3{X: 1, Y: 1, Z: 1}}, args, 0))
	case 4:
		if c.find(addrs[2]) >= 0 && rng.IntN(4) == 0 {
			must(t, c.Free(addrs[2]))
		}
	}
}

// TestPrefaultKeepsContents: prefaulting an allocation while it is written
// changes none of its bytes.
func TestPrefaultKeepsContents(t *testing.T) {
	ctx, err := New(64<<20).NewContext(1<<32, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	const base, n = 1 << 32, 32 << 20
	if err := ctx.Alloc(base, n); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, n)
	for i := range want {
		want[i] = byte(i * 7)
	}
	ctx.(gpu.Prefaulter).Prefault(base, n)
	for off := 0; off < n; off += 1 << 20 {
		if err := ctx.CopyHtoD(base+uint64(off), want[off:off+1<<20], 0); err != nil {
			t.Fatal(err)
		}
	}
	ctx.(gpu.Prefaulter).Prefault(base, n) // over written memory too
	time.Sleep(50 * time.Millisecond)
	got := make([]byte, n)
	if err := ctx.CopyDtoH(got, base, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("prefaulting changed the allocation's contents")
	}
}
