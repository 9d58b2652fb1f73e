package hypervisor

import (
	"errors"
	"testing"

	"github.com/vgpuha/vgpuha/kernels"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// TestLaunchClusterChecked: a cluster shape must divide the grid and hold
// at most gpu.MaxClusterBlocks blocks; one that does is launched.
func TestLaunchClusterChecked(t *testing.T) {
	sess := newSimSession(t)
	img, err := kernels.Image("vadd")
	if err != nil {
		t.Fatal(err)
	}
	call := func(op abi.Opcode, req abi.Body) abi.Body {
		t.Helper()
		reply, err := sess.handle(op, 0, false, req.Append(nil))
		if err != nil {
			t.Fatalf("%s: %v", op, err)
		}
		return reply
	}
	ptr := call(abi.OpAlloc, &abi.Alloc{Size: 4096}).(*abi.AllocReply).Ptr
	module := call(abi.OpModuleLoad, &abi.ModuleLoad{Image: img}).(*abi.HandleReply).Handle
	function := call(abi.OpGetFunction, &abi.GetFunction{Module: module, Name: "vadd"}).(*abi.HandleReply).Handle
	for _, c := range []struct {
		cluster abi.Dim3
		ok      bool
	}{
		{abi.Dim3{}, true}, {abi.Dim3{X: 2, Y: 1, Z: 1}, true}, {abi.Dim3{X: 4, Y: 1, Z: 1}, true},
		{abi.Dim3{X: 3, Y: 1, Z: 1}, false}, {abi.Dim3{X: 2, Y: 0, Z: 1}, false}, {abi.Dim3{X: 32, Y: 1, Z: 1}, false},
	} {
		l := &abi.Launch{Function: function, Grid: abi.Dim3{X: 4, Y: 1, Z: 1}, Block: abi.Dim3{X: 64, Y: 1, Z: 1}, Cluster: c.cluster,
			Args: []abi.Arg{abi.Ptr(ptr), abi.Ptr(ptr), abi.Ptr(ptr), abi.U32(256)}}
		_, err := sess.handle(abi.OpLaunch, 0, false, l.Append(nil))
		if c.ok && err != nil || !c.ok && !errors.Is(err, abi.StatusInvalidValue) {
			t.Errorf("cluster %v over grid 4: %v (want ok %v)", c.cluster, err, c.ok)
		}
	}
}
