// Package cluster wires a primary (hypervisor + replication log + sender)
// and a standby agent together in one process over real sockets: the
// fixture the replication tests, the benchmarks and the demo share. It owns
// no logic of its own; every part is the production one.
package cluster

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/failover"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/replicate"
	"github.com/vgpuha/vgpuha/standby"
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
	// Failover makes the standby watch the primary and take over, serving
	// guests on StandbyEndpoint; guests opened with Guest resume there.
	Failover bool
	Detector string // "fixed" (default) or "phi"
	// MMIO configures the primary's aperture tracing (nil: the default).
	MMIO *hypervisor.MMIOConfig
}

// Cluster is a running primary and, optionally, standby.
type Cluster struct {
	opts     Options
	Primary  *hypervisor.Server
	Log      *replicate.Log
	Sender   *replicate.Sender
	verifier replicate.Verifier
	Endpoint string // guests' unix endpoint
	// StandbyEndpoint is where a promoted standby serves guests.
	StandbyEndpoint string
	addr            string // standby's replication address
	Standby         *standby.Agent
	ln              net.Listener
	dir             string
	cancel          context.CancelFunc
	stopWatch       context.CancelFunc
}

// Key is the replication key the fixture uses.
var Key = []byte("cluster-fixture-key-0123456789ab")

func (o *Options) backend() (gpu.Backend, error) {
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
	c.StandbyEndpoint = "unix://" + filepath.Join(dir, "standby.sock")
	be, err := opts.backend()
	if err != nil {
		return nil, err
	}
	cfg := hypervisor.DefaultConfig()
	if opts.MMIO != nil {
		cfg.MMIO = *opts.MMIO
	}
	c.Primary, err = hypervisor.NewServer(be, cfg, prometheus.NewRegistry(), opts.Log)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
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
		c.Log = replicate.NewLog(opts.MaxLagBytes)
		c.Primary.Replicate(c.Log, opts.Mode)
		c.Sender, err = replicate.NewSender(replicate.SenderConfig{Addr: c.addr, Key: Key, Mode: opts.Mode, Log: c.Log,
			Snapshot: c.Primary.Snapshot, OnVerify: c.verifier.Deliver, Log_: opts.Log,
			Term: c.Primary.Term, OnFenced: c.Primary.Fence})
		if err != nil {
			return nil, err
		}
		go c.Sender.Run(ctx)
	}
	sock := filepath.Join(dir, "guest.sock")
	gl, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	go c.Primary.Serve(gl)
	c.Endpoint = "unix://" + sock
	return c, nil
}

// StartStandby starts (or restarts, with a fresh replica) the standby.
func (c *Cluster) StartStandby() error {
	be, err := c.opts.backend()
	if err != nil {
		return err
	}
	if s, ok := be.(*sim.Backend); ok {
		s.BaseShift = c.opts.StandbyShift
	}
	cfg := hypervisor.DefaultConfig()
	if c.opts.MMIO != nil {
		cfg.MMIO = *c.opts.MMIO
	}
	a, err := standby.New(be, cfg, Key, prometheus.NewRegistry(), c.opts.Log)
	if err != nil {
		return err
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
	c.Standby, c.ln = a, ln
	go a.Serve(ln)
	if c.opts.Failover {
		ctx, cancel := context.WithCancel(context.Background())
		c.stopWatch = cancel
		go a.Watch(ctx, standby.PromoteConfig{GuestListen: c.StandbyEndpoint, Detector: failover.New(c.opts.Detector)})
	}
	return nil
}

// CutReplicationLink cuts the TCP replication path for good (the standby
// stops listening and drops the link) while UDP heartbeats still flow: the
// partition a standby must not mistake for a dead primary.
func (c *Cluster) CutReplicationLink() {
	c.ln.(*net.TCPListener).Close()
	c.Standby.Receiver.Close()
}

// KillPrimary stops the primary abruptly, as a crash would: its guest
// connections and its replication link drop, its heartbeats stop.
func (c *Cluster) KillPrimary() {
	c.Log.Close() // first: nothing the dying primary does may reach the standby
	c.cancel()
	c.Primary.Close()
}

// StopStandby stops the standby and drops its replica.
func (c *Cluster) StopStandby() {
	if c.Standby != nil {
		if c.stopWatch != nil {
			c.stopWatch()
		}
		c.ln.Close()
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

// Verify compares every object on primary and standby.
func (c *Cluster) Verify() (replicate.Report, error) {
	if err := c.WaitProtected(30 * time.Second); err != nil {
		return replicate.Report{}, err
	}
	return c.verifier.Verify(c.Primary.VerifyPoint, 30*time.Second)
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
	c.cancel()
	c.Primary.Close()
	if c.Log != nil {
		c.Log.Close()
	}
	c.StopStandby()
	os.RemoveAll(c.dir)
}
