package standby_test

import (
	"testing"

	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/internal/lab/cluster"
	"github.com/vgpuha/vgpuha/internal/node"
	"github.com/vgpuha/vgpuha/replicate"
)

// newWorkerCluster is newCluster with every session of both nodes in a
// GPU worker of its own (--guest.workers on, guests' own kernels let in).
func newWorkerCluster(t *testing.T, mode replicate.Mode, withStandby bool) *fixture {
	t.Helper()
	c, err := cluster.Start(cluster.Options{Replicate: true, Mode: mode, StartStandby: withStandby, MaxLagBytes: 64 << 20,
		NewBackend: func() (gpu.Backend, error) {
			be, err := node.GPU{Name: "sim", SimMemoryBytes: 1 << 30, Workers: true, SpareContexts: 2}.Open()
			if err == nil {
				t.Cleanup(func() { be.Close() }) // after the nodes close (cleanups run last first)
			}
			return be, err
		},
		// Guests' own kernels beside other guests: a node refuses to start
		// so unless its backend is workers.
		Hypervisor: func(cfg *hypervisor.Config) { cfg.GuestKernels = true },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return &fixture{Cluster: c, t: t}
}

// TestWorkersReplicaIdentical is TestModesReplicaIdentical (commit mode)
// and TestStandbyLateAndRestarted with workers on both nodes: three guests
// run every workload, each in its own worker on the primary and on the
// standby, and the replica ends bit-identical; a standby started late is
// resynced (without a point-in-time snapshot, which workers do not carry)
// and ends identical too.
func TestWorkersReplicaIdentical(t *testing.T) {
	c := newWorkerCluster(t, replicate.ModeCommit, true)
	c.waitProtected()
	c.runGuests(3, 0)
	rep := c.verify()
	mustMatch(t, rep)
	t.Logf("workers, commit mode: %d objects, %d bytes identical", rep.Objects, rep.Bytes)

	late := newWorkerCluster(t, replicate.ModeCommit, false)
	late.runGuests(2, 0)
	late.startStandby()
	mustMatch(t, late.verify())
	if n := late.Sender.Status().Resyncs; n != 1 {
		t.Errorf("resyncs: %d, want 1", n)
	}
	late.runGuests(1, 0)
	mustMatch(t, late.verify())
}
