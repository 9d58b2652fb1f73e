// Package cluster runs a primary node and, optionally, a standby node
// (internal/node, the same constructors the agents use) in one process over
// real sockets: the fixture the replication tests and the benchmarks share.
// It owns no logic of its own; every part is the production one.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/failover"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/internal/node"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/replicate"
	"github.com/vgpuha/vgpuha/replicate/link"
	"github.com/vgpuha/vgpuha/replicate/receiver"
	"github.com/vgpuha/vgpuha/replicate/verify"
)

// Options configure a cluster.
type Options struct {
	// Replicate enables a standby and the replication log; Mode applies.
	Replicate bool
	Mode      replicate.Mode
	// StartStandby starts the standby with the primary (else call
	// StartStandby later).
	StartStandby bool
	// StandbyShift moves the standby's windows (forces translation).
	StandbyShift uint64
	MaxLagBytes  int64
	Log          *slog.Logger
	// NewBackend makes each node's GPU; nil means a 1 GiB software GPU.
	NewBackend func() (gpu.Backend, error)
	// NewStandbyBackend, when set, makes the standby's GPU instead (a
	// second device, so that primary and standby do not time-slice one).
	NewStandbyBackend func() (gpu.Backend, error)
	// Failover makes the standby watch the primary and take over, serving
	// guests on StandbyEndpoint; guests opened with Guest resume there.
	Failover bool
	Detector string // "fixed" (default) or "phi"
	// FailoverAfter, when set, is the fixed detector's silence before the
	// standby takes over (default failover.DefaultTimeout). Tests that never
	// kill the primary set it long, so that a scheduling stall under -race
	// on a loaded machine is not taken for a dead primary.
	FailoverAfter time.Duration
	// MMIO configures the primary's aperture tracing (nil: the default).
	MMIO *hypervisor.MMIOConfig
	// GuestTCP serves guests over TCP on loopback instead of unix sockets
	// (Endpoint and StandbyEndpoint are tcp:// then).
	GuestTCP bool
	// OneGuestPerProcess serves one guest per node process, which lets
	// kernels that follow stored pointers run on a GPU that does not check
	// every access (hypervisor.Config.GuestKernels).
	OneGuestPerProcess bool
	// GuestScheme is the guests' endpoint scheme on both nodes: "unix"
	// (default) or "shm+unix" (shared memory; plain unix is served too).
	GuestScheme string
	// Faults sees every replication message the primary sends.
	Faults link.FaultHook
	// ResyncRate, ResyncBudgetBytes and ResyncGuestShare configure the
	// primary's resync.
	ResyncRate, ResyncBudgetBytes int64
	ResyncGuestShare              float64
	// ReadCheckBytes is the primary's node.Config.ReadCheckBytes (0: the
	// default; negative: no read checks).
	ReadCheckBytes int64
	// Hypervisor, when set, adjusts both nodes' hypervisor configuration.
	Hypervisor func(*hypervisor.Config)
}

// Cluster is a running primary and, optionally, standby.
type Cluster struct {
	opts        Options
	PrimaryNode *node.Node
	Primary     *hypervisor.Server // PrimaryNode's server
	Log         *replicate.Log     // PrimaryNode's log (nil without Replicate)
	Sender      *replicate.Sender  // PrimaryNode's sender (nil without Replicate)
	Endpoint    string             // guests' endpoint (Options.GuestScheme)
	// StandbyEndpoint is where a promoted standby serves guests.
	StandbyEndpoint string
	addr            string // standby's replication address
	Standby         *node.Node
	dir             string
}

// Key is the replication key the fixture uses.
var Key = []byte("cluster-fixture-key-0123456789ab")

func (o *Options) backend(standby bool) (gpu.Backend, error) {
	if standby && o.NewStandbyBackend != nil {
		return o.NewStandbyBackend()
	}
	if o.NewBackend != nil {
		return o.NewBackend()
	}
	return sim.New(1 << 30), nil
}

// Start starts a cluster.
func Start(opts Options) (*Cluster, error) {
	if opts.Log == nil {
		opts.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.MaxLagBytes == 0 {
		opts.MaxLagBytes = 64 << 20
	}
	c := &Cluster{opts: opts}
	dir, err := os.MkdirTemp("", "vgpuha-cluster")
	if err != nil {
		return nil, err
	}
	c.dir = dir
	scheme := opts.GuestScheme
	if scheme == "" {
		scheme = "unix"
	}
	c.StandbyEndpoint = scheme + "://" + filepath.Join(dir, "standby.sock")
	c.Endpoint = scheme + "://" + filepath.Join(dir, "guest.sock")
	if opts.GuestTCP {
		if c.Endpoint, err = freeTCP(); err == nil {
			c.StandbyEndpoint, err = freeTCP()
		}
		if err != nil {
			return nil, err
		}
	}
	cfg, err := c.nodeConfig(c.Endpoint, false)
	if err != nil {
		return nil, err
	}
	cfg.Faults, cfg.ResyncRate, cfg.ResyncBudgetBytes, cfg.ResyncGuestShare = opts.Faults, opts.ResyncRate, opts.ResyncBudgetBytes, opts.ResyncGuestShare
	cfg.ReadCheckBytes = opts.ReadCheckBytes
	if opts.Replicate {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		c.addr = ln.Addr().String()
		ln.Close()
		if opts.StartStandby {
			if err := c.StartStandby(); err != nil {
				return nil, err
			}
		}
		cfg.ReplicateTo = []string{c.addr}
	}
	if c.PrimaryNode, err = node.StartPrimary(cfg); err != nil {
		return nil, err
	}
	c.Primary, c.Log, c.Sender = c.PrimaryNode.Server(), c.PrimaryNode.Log(), c.PrimaryNode.Sender()
	return c, nil
}

// freeTCP is a tcp:// endpoint on a loopback port that was free just now.
func freeTCP() (string, error) {
	// A port the kernel hands out for outgoing connections could be taken
	// by one (a replication link, say) before a standby listens on it at
	// its promotion: pick below the ephemeral range.
	for range 100 {
		port := 20000 + rand.IntN(12000)
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		ln.Close()
		return "tcp://" + ln.Addr().String(), nil
	}
	return "", errors.New("no free TCP port below the ephemeral range")
}

// nodeConfig is a node's configuration serving guests on guests.
func (c *Cluster) nodeConfig(guests string, standby bool) (node.Config, error) {
	be, err := c.opts.backend(standby)
	if err != nil {
		return node.Config{}, err
	}
	cfg := node.Config{Backend: be, Hypervisor: hypervisor.DefaultConfig(), Registry: prometheus.NewRegistry(),
		Logger: c.opts.Log, GuestListen: guests, Mode: c.opts.Mode, Key: Key, MaxLagBytes: c.opts.MaxLagBytes}
	if c.opts.MMIO != nil {
		cfg.Hypervisor.MMIO = *c.opts.MMIO
	}
	if c.opts.OneGuestPerProcess {
		cfg.Hypervisor.GuestKernels, cfg.Hypervisor.MaxSessions = true, 1
	}
	if c.opts.Hypervisor != nil {
		c.opts.Hypervisor(&cfg.Hypervisor)
	}
	return cfg, nil
}

// StartStandby starts (or restarts, with a fresh replica) the standby.
func (c *Cluster) StartStandby() error {
	cfg, err := c.nodeConfig("", true)
	if err != nil {
		return err
	}
	if s, ok := cfg.Backend.(*sim.Backend); ok {
		s.BaseShift = c.opts.StandbyShift
	}
	if c.opts.Failover {
		cfg.GuestListen = c.StandbyEndpoint
		if cfg.Detector, err = failover.New(c.opts.Detector); err != nil {
			return err
		}
		if f, ok := cfg.Detector.(*failover.Fixed); ok && c.opts.FailoverAfter > 0 {
			f.Timeout = c.opts.FailoverAfter
		}
	}
	var ln net.Listener
	for i := 0; i < 100; i++ { // the port may linger briefly after a stop
		if ln, err = net.Listen("tcp", c.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	c.Standby, err = node.StartStandby(cfg, ln)
	return err
}

// StandbyView is what tests read of the standby: its role, the stream
// it takes and its replica.
type StandbyView struct {
	Role        string
	Replication receiver.ReceiverStatus
	Replica     hypervisor.Status
}

// StandbyStatus is the standby node's status, from the parts' own
// accessors (the node's /status is node.Status).
func (c *Cluster) StandbyStatus() StandbyView {
	role, _ := c.Standby.Role()
	return StandbyView{Role: role.String(), Replication: c.Standby.Agent().Receiver.Status(), Replica: c.Standby.Server().Status()}
}

// CutReplicationLink cuts the TCP replication path for good (the standby
// stops listening and drops the link) while UDP heartbeats still flow: the
// partition a standby must not mistake for a dead primary.
func (c *Cluster) CutReplicationLink() {
	c.Standby.CloseReplicationListener()
	c.Standby.Agent().Receiver.Close()
}

// KillPrimary stops the primary abruptly, as a crash would: its guest
// connections and its replication link drop, its heartbeats stop.
func (c *Cluster) KillPrimary() {
	c.Log.Close() // first: nothing the dying primary does may reach the standby
	c.PrimaryNode.Close()
}

// StopStandby stops the standby and drops its replica.
func (c *Cluster) StopStandby() {
	if c.Standby != nil {
		c.Standby.Close()
		c.Standby = nil
	}
}

// WaitProtected waits until the standby holds everything.
func (c *Cluster) WaitProtected(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for !c.Sender.Status().Protected {
		if time.Now().After(deadline) {
			return fmt.Errorf("standby never caught up: %+v", c.Sender.Status())
		}
		time.Sleep(2 * time.Millisecond)
	}
	return nil
}

// Verify compares every object on primary and standby, and each
// aperture's file byte by byte with both device copies.
func (c *Cluster) Verify() (verify.Report, error) {
	if err := c.WaitProtected(30 * time.Second); err != nil {
		return verify.Report{}, err
	}
	return c.PrimaryNode.Verify(node.VerifyOptions{Apertures: true}, 30*time.Second)
}

// Guest opens a guest session.
func (c *Cluster) Guest(name string) (*pvdriver.Client, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	opts := pvdriver.Options{GuestName: name}
	if c.opts.Failover {
		opts.Failover = []string{c.StandbyEndpoint}
	}
	return pvdriver.Open(ctx, c.Endpoint, opts)
}

// Close stops everything.
func (c *Cluster) Close() {
	c.PrimaryNode.Close()
	c.StopStandby()
	os.RemoveAll(c.dir)
}
