package hypervisor

import (
	"errors"
	"testing"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// TestOccupancyOnTheSoftwareGPU: an occupancy question is answered by the
// context's GPU (the software GPU's residency limits: 2048 threads, 32
// blocks and 96 KiB of shared memory per multiprocessor); a question about
// clusters, which it does not launch, is not supported; an unknown
// function or an empty or oversized block is refused before the GPU.
func TestOccupancyOnTheSoftwareGPU(t *testing.T) {
	sess := newSimSession(t)
	reply, err := sess.handle(abi.OpGetFunction, 2, false, (&abi.GetFunction{Module: loadVadd(t, sess, 1), Name: "vadd"}).Append(nil))
	if err != nil {
		t.Fatal(err)
	}
	fn := abi.ResultOf(reply)
	blocks := func(threads, shared uint32) *abi.Occupancy {
		return &abi.Occupancy{Function: fn, Kind: abi.OccupancyBlocks, Block: abi.Dim3{X: threads, Y: 1, Z: 1}, SharedBytes: shared}
	}
	for i, tt := range []struct {
		q    *abi.Occupancy
		want int32
		err  abi.Status
	}{
		{q: blocks(64, 0), want: 32},
		{q: blocks(1024, 0), want: 2},
		{q: blocks(128, 40<<10), want: 2},
		{q: &abi.Occupancy{Function: fn, Kind: abi.OccupancyClusters, Block: abi.Dim3{X: 128, Y: 1, Z: 1},
			Grid: abi.Dim3{X: 64, Y: 1, Z: 1}, Cluster: abi.Dim3{X: 2, Y: 1, Z: 1}}, err: abi.StatusNotSupported},
		{q: &abi.Occupancy{Function: fn + 99, Kind: abi.OccupancyBlocks, Block: abi.Dim3{X: 64, Y: 1, Z: 1}}, err: abi.StatusInvalidHandle},
		{q: blocks(0, 0), err: abi.StatusInvalidValue},
		{q: blocks(2048, 0), err: abi.StatusInvalidValue},
	} {
		reply, err := sess.handle(abi.OpOccupancy, uint64(i+3), false, tt.q.Append(nil))
		if tt.err != abi.StatusOK {
			if st := statusOf(err); !errors.Is(err, tt.err) && st != tt.err {
				t.Errorf("%+v: %v (status %v), want %v", tt.q, err, st, tt.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%+v: %v", tt.q, err)
			continue
		}
		if got := reply.(*abi.OccupancyReply).Value; got != tt.want {
			t.Errorf("%+v: %d blocks, want %d", tt.q, got, tt.want)
		}
	}
}
