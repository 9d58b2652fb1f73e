package standby_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/placement"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/internal/lab/cluster"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/replicate"
)

// twoSimGPUs is a node of two software GPUs, numbered 0 and 1.
func twoSimGPUs() (gpu.Backend, error) {
	a, b := sim.New(1<<30), sim.New(1<<30)
	b.Number = 1
	return gpu.NewSet(gpu.Device{Index: 0, Backend: a}, gpu.Device{Index: 1, Backend: b})
}

// TestTwoGPUsResync: a standby joins a primary of two GPUs whose guests
// (one pinned to GPU 1) already hold memory; the resync snapshot opens
// every replica on a GPU of the standby's own choosing (the pinned one on
// the GPU its guest pinned), verify finds them identical, and once the
// primary dies every guest reads its own bytes back on the new primary.
func TestTwoGPUsResync(t *testing.T) {
	cl, err := cluster.Start(cluster.Options{Replicate: true, Mode: replicate.ModeCommit, Failover: true, NewBackend: twoSimGPUs,
		Hypervisor: func(cfg *hypervisor.Config) { cfg.MemoryQuota, cfg.Placement = 256<<20, placement.FewestGuests }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	f := &fixture{Cluster: cl, t: t}
	type guest struct {
		c    *pvdriver.Client
		ptr  pvdriver.DevicePtr
		data []byte
	}
	var guests []guest
	for i, pin := range []string{"1", "", ""} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := pvdriver.Open(ctx, cl.Endpoint, pvdriver.Options{GuestName: "g", GPU: pin, Failover: []string{cl.StandbyEndpoint}})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		g := guest{c: c, data: bytes.Repeat([]byte{byte(i + 1)}, 3<<20)}
		if g.ptr, err = c.Alloc(uint64(len(g.data))); err != nil {
			t.Fatal(err)
		}
		if err := c.CopyHtoD(g.ptr, g.data); err != nil {
			t.Fatal(err)
		}
		guests = append(guests, g)
	}
	gpuOf := func(st hypervisor.Status) map[uint64]int {
		out := map[uint64]int{}
		for _, s := range st.Sessions {
			out[s.ID] = s.GPU
		}
		return out
	}
	if got := gpuOf(cl.Primary.Status()); got[guests[0].c.Session()] != 1 || got[guests[1].c.Session()] != 0 {
		t.Fatalf("the primary placed the sessions on %v", got)
	}

	f.startStandby()
	f.waitProtected()
	mustMatch(t, f.verify())
	replicas := cl.StandbyStatus().Replica
	if got := gpuOf(replicas); len(got) != 3 || got[guests[0].c.Session()] != 1 || replicas.GPUs[0].Sessions != 2 || replicas.GPUs[1].Sessions != 1 {
		t.Fatalf("the standby's replicas after its resync: on %v, GPUs %+v", got, replicas.GPUs)
	}

	cl.KillPrimary()
	for i, g := range guests {
		back := make([]byte, len(g.data))
		if err := g.c.CopyDtoH(back, g.ptr); err != nil || !bytes.Equal(back, g.data) {
			t.Fatalf("guest %d after the failover: %v (bytes equal: %v)", i, err, bytes.Equal(back, g.data))
		}
		if fo := g.c.Failovers(); len(fo) != 1 {
			t.Fatalf("guest %d moved %d times, want once", i, len(fo))
		}
	}
	st := cl.Standby.Server().Status()
	if got := gpuOf(st); got[guests[0].c.Session()] != 1 || st.Detached != 0 {
		t.Fatalf("the new primary serves the sessions on %v, %d detached", got, st.Detached)
	}
}
