package objects

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/vgpuha/vgpuha/handlemap"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
)

// variablesGPU is a context whose module variables lie where a node's GPU
// put them (vars, by name, 4 KiB each) and whose tensor maps name the
// address they were encoded for, as a GPU driver's do (the bytes are
// this test's own format: the driver's is opaque).
type variablesGPU struct {
	gpu.Context // nil: only what follows is called
	vars        map[string]uint64
}

func (g *variablesGPU) Global(_ gpu.Module, name string) (uint64, uint64, error) {
	return g.vars[name], 4096, nil
}
func (g *variablesGPU) WriteGlobal(uint64, []byte) error { return nil }
func (g *variablesGPU) ReadGlobal([]byte, uint64) error  { return nil }

func (g *variablesGPU) EncodeTensorMapTiled(r *abi.TensorMapEncode) (mp [abi.TensorMapBytes]byte, err error) {
	binary.LittleEndian.PutUint64(mp[:], r.Global)
	sum := sha256.Sum256(r.Append(nil))
	copy(mp[8:], sum[:])
	return mp, nil
}

// noAllocations is a session memory holding nothing.
type noAllocations struct{}

func (noAllocations) CheckRange(addr, n uint64, what string) error {
	return errors.Join(abi.StatusOutOfRange, errors.New(what+": not inside one of this session's allocations"))
}
func (noAllocations) Contains(uint64, uint64) bool { return false }
func (noAllocations) Delta() uint64                { return 0 }
func (noAllocations) Allocations() int             { return 0 }

// nodeWithVariables is a session of a node whose variables "c" and "d"
// of module 1 lie at c and d.
func nodeWithVariables(t *testing.T, c, d uint64) *Set {
	o := New(&variablesGPU{vars: map[string]uint64{"c": c, "d": d}}, noAllocations{}, Config{MaxObjects: 100})
	if h, err := o.handles.Insert(handlemap.KindModule, 1, 0); err != nil || h != 1 {
		t.Fatalf("module handle %d, %v", h, err)
	}
	return o
}

// TestTensorMapsOverModuleVariables: the primary encodes a map over its
// copy of a module variable and logs it once; a standby whose copy lies
// elsewhere (where the primary's copy of another variable the guest holds
// lies) encodes its own from the record and puts it, whole, in place of
// the primary's in a launch's 128-byte arguments, nothing else; a map
// reaching past the variable is refused; a resync emits what the guest
// holds; and a session holding maxTensorMaps maps is refused another.
func TestTensorMapsOverModuleVariables(t *testing.T) {
	primary := nodeWithVariables(t, 0x7f00_0000_1000, 0x7e55_0000_8000)
	standby := nodeWithVariables(t, 0x7e55_0000_8000, 0x7d00_0000_0000)
	var addr uint64
	for _, name := range []string{"d", "c"} {
		reply, err := primary.ModuleGlobal(&abi.ModuleGlobal{Module: 1, Name: name})
		if err != nil {
			t.Fatal(err)
		}
		addr = reply.(*abi.GlobalReply).Addr
		own, err := standby.NoteGlobalAddr(&abi.ModuleGlobal{Module: 1, Name: name}, addr)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[string]uint64{"c": 0x7e55_0000_8000, "d": 0x7d00_0000_0000}[name]; own != want {
			t.Fatalf("the standby's %s at %#x, the guest's at %#x: want the standby's own, %#x", name, own, addr, want)
		}
	}
	tile := func(off, elems uint64) *abi.TensorMapEncode {
		return &abi.TensorMapEncode{DataType: 7, Rank: 1, Global: addr + off, Dims: [abi.MaxTensorRank]uint64{elems},
			Box: [abi.MaxTensorRank]uint32{16}, ElementStrides: [abi.MaxTensorRank]uint32{1}}
	}
	reply, err := primary.TensorMapEncode(tile(256, 960)) // to the variable's last byte
	if err != nil {
		t.Fatal(err)
	}
	guestMap := reply.(*abi.TensorMapReply).Map
	req, ok := primary.TensorMapRecord(guestMap)
	if !ok || *req != *tile(256, 960) {
		t.Fatalf("the primary's record: %+v, %v", req, ok)
	}
	if _, again := primary.TensorMapRecord(guestMap); again {
		t.Error("the primary would log the same map twice")
	}
	if _, err := primary.TensorMapEncode(tile(256, 961)); !errors.Is(err, abi.StatusOutOfRange) {
		t.Errorf("a map one element past the variable: %v", err)
	}

	logged, gotMap, err := replicate.DecodeTensorMap(replicate.AppendTensorMap(nil, req, guestMap))
	if err != nil || gotMap != guestMap {
		t.Fatalf("record round trip: %v", err)
	}
	if err := standby.NoteTensorMap(logged, guestMap); err != nil {
		t.Fatal(err)
	}
	onStandby := *tile(256, 960)
	onStandby.Global = 0x7e55_0000_8100
	want, _ := standby.ctx.(*variablesGPU).EncodeTensorMapTiled(&onStandby)
	other := bytes.Repeat([]byte{7}, abi.TensorMapBytes)
	args := []abi.Arg{{Kind: abi.ArgPtr, Bits: 0x7e00_0000_0000}, abi.Bytes(guestMap[:]), abi.Bytes(other), abi.Bytes(guestMap[8:72])}
	got := standby.localArgs(args)
	if !bytes.Equal(got[1].Raw, want[:]) {
		t.Errorf("the standby's launch argument: % x\nwant % x", got[1].Raw[:16], want[:16])
	}
	if got[0].Bits != args[0].Bits || !bytes.Equal(got[2].Raw, other) || !bytes.Equal(got[3].Raw, guestMap[8:72]) || !bytes.Equal(args[1].Raw, guestMap[:]) {
		t.Error("args changed an argument that is not the guest's map, or the caller's arguments")
	}
	if out := primary.localArgs(args); &out[0] != &args[0] {
		t.Error("the primary copied arguments that hold no foreign map")
	}
	var emitted int
	primary.TensorMapRecords(func(r *abi.TensorMapEncode, mp [abi.TensorMapBytes]byte) {
		emitted++
		if *r != *tile(256, 960) || mp != guestMap {
			t.Errorf("resync record %+v", r)
		}
	})
	if emitted != 1 {
		t.Errorf("a resync logs %d maps, want 1", emitted)
	}

	for i := uint64(1); i < maxTensorMaps; i++ {
		if _, err := primary.TensorMapEncode(tile(i%16*4, 1+i/16)); err != nil {
			t.Fatalf("map %d: %v", i, err)
		}
	}
	if _, err := primary.TensorMapEncode(tile(0, 1000)); !errors.Is(err, abi.StatusOutOfMemory) { // a map not held yet
		t.Errorf("map %d: %v, want out of memory", maxTensorMaps+1, err)
	}
}
