package node_test

import (
	"strings"
	"testing"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/internal/node"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// TestOpenSimGPUs: --sim.gpus N opens N independent software GPUs, each
// of its own memory and UUID, in the node's process or, with workers, each
// in workers that open that GPU; one GPU stays a plain backend.
func TestOpenSimGPUs(t *testing.T) {
	one, err := node.GPU{Name: "sim", SimMemoryBytes: 1 << 24}.Open()
	if err != nil {
		t.Fatal(err)
	}
	one.Close()
	if _, isSet := one.(*gpu.Set); isSet {
		t.Error("one software GPU opened as a set")
	}
	for _, workers := range []bool{false, true} {
		b, err := node.GPU{Name: "sim", SimMemoryBytes: 1 << 24, SimGPUs: 3, Workers: workers}.Open()
		if err != nil {
			t.Fatal(err)
		}
		devs := gpu.DevicesOf(b)
		if len(devs) != 3 {
			t.Fatalf("workers %v: %d GPUs, want 3", workers, len(devs))
		}
		for i, d := range devs {
			info, err := d.Backend.(gpu.DeviceDescriber).DeviceInfo()
			if err != nil || d.Index != i || info.UUID[15] != byte(i) || info.TotalMem != 1<<24 || gpu.IsolatesContexts(d.Backend) != workers {
				t.Errorf("workers %v: GPU %d: index %d, %s, %d bytes, %v", workers, i, d.Index, abi.UUIDString(info.UUID), info.TotalMem, err)
			}
			// Each GPU's memory is its own: all of it can be allocated on each.
			ctx, err := d.Backend.NewContext(0x7e0000000000+uint64(i)<<36, 1<<30)
			if err != nil {
				t.Fatal(err)
			}
			if err := ctx.Alloc(0x7e0000000000+uint64(i)<<36, 1<<24); err != nil {
				t.Errorf("workers %v: GPU %d: allocating all its memory: %v", workers, i, err)
			}
			ctx.Close()
		}
		b.Close()
	}
	if _, err := (node.GPU{Name: "cuda", SimGPUs: 2}).Open(); err == nil || !strings.Contains(err.Error(), "--sim.gpus") {
		t.Errorf("--sim.gpus with cuda: %v", err)
	}
}
