package bench

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/internal/lab/cluster"
	"github.com/vgpuha/vgpuha/internal/lab/drill"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/replicate"
	"github.com/vgpuha/vgpuha/replicate/verify"
)

// resyncNodes is where a resync row's primary and standby run: inside
// this process (cluster) or as processes of their own (drill.Nodes). In
// one process the standby's memory, allocations and garbage collector
// share the primary's address space and cores, so its work shows in the
// guests' call times; with processes only the host's cores are shared.
type resyncNodes interface {
	guest(name string) (*pvdriver.Client, error)
	startStandby() error
	waitProtected(time.Duration) error
	lastResync() (drill.ResyncFigures, error)
	verify() (verify.Report, error)
	close()
}

// startResyncNodes starts a primary (its standby joins later) whose
// quotas let guests hold size bytes together.
func startResyncNodes(opts ResyncOptions, size uint64, method string) (resyncNodes, error) {
	perGuest := size / uint64(opts.Guests)
	guestQuota, tenantQuota := perGuest+256<<20, size+uint64(opts.Guests)*256<<20
	if p := opts.Processes; p != nil {
		if method == "stop-the-world" {
			return nil, fmt.Errorf("a %s resync runs only inside this process", method)
		}
		o := *p
		o.Flags = append([]string{"--guest.memory-quota-bytes", strconv.FormatUint(guestQuota, 10),
			"--tenant.memory-quota-bytes", strconv.FormatUint(tenantQuota, 10)}, o.Flags...)
		o.PrimaryFlags = append([]string{"--replicate.resync-rate", strconv.FormatInt(opts.Rate, 10)}, o.PrimaryFlags...)
		if opts.Budget > 0 {
			o.PrimaryFlags = append(o.PrimaryFlags, "--replicate.resync-budget-bytes", strconv.FormatInt(opts.Budget, 10))
		}
		if opts.GuestShare > 0 {
			o.PrimaryFlags = append(o.PrimaryFlags, "--replicate.resync-guest-share", strconv.FormatFloat(opts.GuestShare, 'g', -1, 64))
		}
		n, err := drill.StartNodes(o)
		if err != nil {
			return nil, err
		}
		return processNodes{n, opts.Progress}, nil
	}
	newBackend := opts.NewBackend
	if method == "stop-the-world" {
		newBackend = withoutSnapshots(opts.NewBackend)
	}
	c, err := cluster.Start(cluster.Options{Replicate: true, Mode: replicate.ModeCommit, NewBackend: newBackend,
		NewStandbyBackend: opts.NewStandbyBackend, Log: opts.Log, ResyncRate: opts.Rate, ResyncBudgetBytes: opts.Budget, ResyncGuestShare: opts.GuestShare, Hypervisor: func(h *hypervisor.Config) {
			h.MemoryQuota = max(h.MemoryQuota, guestQuota)
			h.TenantMemoryQuota = max(h.TenantMemoryQuota, tenantQuota)
		}})
	if err != nil {
		return nil, err
	}
	return clusterNodes{c}, nil
}

// clusterNodes are both nodes inside this process.
type clusterNodes struct{ c *cluster.Cluster }

func (n clusterNodes) guest(name string) (*pvdriver.Client, error) { return n.c.Guest(name) }
func (n clusterNodes) startStandby() error                         { return n.c.StartStandby() }
func (n clusterNodes) waitProtected(d time.Duration) error         { return n.c.WaitProtected(d) }
func (n clusterNodes) verify() (verify.Report, error)              { return n.c.Verify() }
func (n clusterNodes) close()                                      { n.c.Close() }

func (n clusterNodes) lastResync() (drill.ResyncFigures, error) {
	st := n.c.Sender.Status()
	return drill.ResyncFigures{PauseSeconds: st.LastPauseMS / 1000, Seconds: st.LastResync, Bytes: st.LastResyncBytes,
		SnapshotSeconds: st.LastSnapshot, Restarts: st.ResyncRestarts}, nil
}

// processNodes are a primary and a standby process.
type processNodes struct {
	n        *drill.Nodes
	progress io.Writer // told where logs were kept, if any (nil: nobody)
}

func (n processNodes) guest(name string) (*pvdriver.Client, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ep, failover := n.n.Endpoints()
	return pvdriver.Open(ctx, ep, pvdriver.Options{GuestName: name, Failover: failover})
}

func (n processNodes) startStandby() error                      { return n.n.StartStandby() }
func (n processNodes) waitProtected(d time.Duration) error      { return n.n.WaitProtected(d) }
func (n processNodes) lastResync() (drill.ResyncFigures, error) { return n.n.LastResync() }
func (n processNodes) verify() (verify.Report, error)           { return n.n.Verify(5 * time.Minute) }

func (n processNodes) close() {
	n.n.Close()
	if dir := n.n.KeptLogs(); dir != "" && n.progress != nil {
		fmt.Fprintf(n.progress, "  the nodes' logs are in %s\n", dir)
	}
}
