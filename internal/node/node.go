// Package node builds a vgpuha node: one hypervisor server, and around it
// either the primary's parts (replication log, sender, verifier, the admin
// handlers for verify, switchover and epochs) or the standby's (the
// replication receiver feeding the replica), with one role authority
// (failover.Node) deciding what the node does. A standby that takes over
// becomes a primary through the same code a node started as primary runs
// (becomePrimary), so a promoted node serves, replicates to the next
// standbys (coordinated: also the group's other standbys, which follow
// it), verifies and hands over exactly like the first primary. A primary
// streams to each of its standbys with its own sender, from one log
// (standbys.go).
//
// Run (run.go) is a node process's whole life around it: the GPU backend,
// the coordinator's connection, the failure detector, the admin endpoint,
// SIGHUP reloads and systemd's readiness; the agent's commands only parse
// flags and call it.
//
// It owns the wiring and the execution of role decisions; it must never
// decide a role itself: events go into the authority, actions come out
// (see authority.go).
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/failover"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/internal/coordinator"
	"github.com/vgpuha/vgpuha/pvdriver/transport"
	"github.com/vgpuha/vgpuha/replicate"
	"github.com/vgpuha/vgpuha/replicate/link"
	"github.com/vgpuha/vgpuha/standby"
)

// Config configures a node.
type Config struct {
	Backend    gpu.Backend // the node's GPU; the caller closes it after Close
	Hypervisor hypervisor.Config
	Registry   prometheus.Registerer
	Logger     *slog.Logger
	// GuestListen is where the node serves guests: at once when started as
	// primary, once promoted when started as standby ("": a standby that
	// never takes over, a pure replica).
	GuestListen string
	// ReplicateTo are the standbys (tcp host:port), in priority order, the
	// node streams to while it is primary (none: unprotected), in Mode,
	// with Key.
	ReplicateTo []string
	// MinInSync is k: the commit rule waits for the first k caught-up
	// standbys (default 1; replicate/peers.go says what happens with
	// fewer).
	MinInSync int
	Mode      replicate.Mode
	Key       []byte
	// MaxLagBytes bounds the log's unapplied bytes (default 256 MiB).
	MaxLagBytes int64
	// ResyncBudgetBytes bounds what the log keeps while a resync streams
	// (0: a quarter of each snapshot, at least replicate.DefaultResyncBudget); guests writing past half of
	// it wait for the snapshot stream to progress, each write at most
	// ResyncStall (default replicate.DefaultResyncStall).
	ResyncBudgetBytes int64
	ResyncStall       time.Duration
	// ResyncGuestShare, when above 0, is the most of the link guests'
	// writes take while a standby joins (replicate.Log.SetResyncGuestShare).
	ResyncGuestShare float64
	// ResyncRate bounds a resync's stream in bytes per second (0: none).
	ResyncRate int64
	// ReadCheckBytes: a guest's read of this many bytes or more goes on
	// the link as a check, its bytes only where the standby's differ
	// (replicate.Log.SetReadCheckMin; 0: replicate.DefaultReadCheckMin;
	// negative: none, every read's bytes go).
	ReadCheckBytes int64
	// SessionShareBytes bounds one session's bytes in the log that the
	// sync set has not received (replicate.Log.SetSessionShare; 0: the
	// log's default, replicate.DefaultSessionShare; negative: none).
	SessionShareBytes int64
	// Detector watches the primary's heartbeats (standby only).
	Detector failover.Detector
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// Faults, when set, sees every replication message this node sends
	// (tests only).
	Faults link.FaultHook
	// Coordinator, when set, puts leadership in etcd (see package
	// coordinator and coordinated.go): a primary leads before it serves, a
	// standby campaigns instead of promoting itself, and a leader whose
	// standby is gone for StandbyLossAfter (default 3 s) takes one from
	// the group's pool. The node closes it.
	Coordinator      *coordinator.Coordinator
	StandbyLossAfter time.Duration
	// Group names the pair (package replicate/admission): a primary streams
	// under it, a standby follows only its primaries. Empty: the
	// coordinator's group with one, else the first primary's id, which a
	// promoted standby carries on.
	Group string
	// Adopt: a standby follows the first primary that connects whatever
	// its group (the operator's --adopt).
	Adopt bool
}

// Node is a running vgpuha node.
type Node struct {
	cfg    Config
	srv    *hypervisor.Server
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	auth   authority
	agent  *standby.Agent // nil on a node started as primary
	served chan error     // the guest listener's end

	execMu sync.Mutex // role actions and standby replacement, one at a time
	coord  coordState // with a coordinator (coordinated.go)

	mu        sync.Mutex
	repl      *replication // while primary and replicating
	promotion *Promotion
	guestLn   net.Listener
	// servingFrom and servingUntil bound the time this node served guests
	// (until zero: still serving, or never fenced).
	servingFrom, servingUntil time.Time
	// guestListenErr is why a promoted standby does not serve guests yet
	// (its endpoint is taken; health.go reports it).
	guestListenErr error
	replLn         net.Listener // a standby's replication listener
	wg             sync.WaitGroup
}

// StartPrimary starts the first primary (term 1): it serves guests on
// cfg.GuestListen and, with cfg.ReplicateTo, streams to those standbys.
func StartPrimary(cfg Config) (*Node, error) {
	role := failover.NewPrimary()
	if cfg.Coordinator != nil {
		var err error
		if role, err = lead(cfg); err != nil {
			return nil, err
		}
	}
	n, err := newNode(cfg, role)
	if err != nil {
		return nil, err
	}
	if err := n.becomePrimary(); err != nil {
		n.Close()
		return nil, err
	}
	n.coordinate()
	return n, nil
}

// StartStandby starts a standby taking the primary's stream on ln. With
// cfg.GuestListen and cfg.Detector it takes over when the primary goes
// silent (or hands over); without, it is a pure replica.
func StartStandby(cfg Config, ln net.Listener) (*Node, error) {
	det := cfg.Detector
	if cfg.GuestListen == "" {
		det = nil // a pure replica never takes over
	}
	role := failover.NewStandby(det)
	role.Coordinated = cfg.Coordinator != nil
	if role.Coordinated {
		role.SuspendLimit = cfg.Coordinator.TTL() // once it took over
	}
	n, err := newNode(cfg, role)
	if err != nil {
		return nil, err
	}
	adm := standby.Admission{Group: n.configuredGroup(), Adopt: cfg.Adopt}
	n.agent, err = standby.New(n.srv, n.cfg.Backend, n.cfg.Key, adm, &n.auth, n.cfg.Registry, n.log)
	if err == nil {
		err = n.registerStandbyMetrics()
	}
	if err != nil {
		n.Close()
		return nil, err
	}
	n.replLn = ln
	n.wg.Add(1)
	go func() { defer n.wg.Done(); n.agent.Serve(ln) }()
	if cfg.Coordinator != nil {
		cfg.Coordinator.WatchTerm(n.auth.LeaderElected)
	}
	n.coordinate()
	return n, nil
}

func newNode(cfg Config, role *failover.Node) (*Node, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.MaxLagBytes == 0 {
		cfg.MaxLagBytes = 256 << 20
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.MinInSync = max(cfg.MinInSync, 1)
	if cfg.StandbyLossAfter == 0 {
		cfg.StandbyLossAfter = 3 * time.Second
	}
	if cfg.Hypervisor.DeviceIdentity == nil {
		cfg.Hypervisor.DeviceIdentity = cfg.Key // a pair's nodes show its guests the same devices (nil: unreplicated)
	}
	srv, err := hypervisor.NewServer(cfg.Backend, cfg.Hypervisor, cfg.Registry, cfg.Logger)
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, srv: srv, log: cfg.Logger, served: make(chan error, 1)}
	n.coord.kick = make(chan struct{}, 1)
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.auth.init(role, cfg.Now, n.execute, n.pushRole)
	n.wg.Add(1)
	go func() { defer n.wg.Done(); n.auth.run(n.ctx) }()
	return n, nil
}

// configuredGroup is the pair's group as configured: Config.Group, else
// the coordinator's group ("" without either).
func (n *Node) configuredGroup() string {
	if n.cfg.Group == "" && n.cfg.Coordinator != nil {
		return n.cfg.Coordinator.Group()
	}
	return n.cfg.Group
}

// pairGroup is the group this node streams under as primary: as
// configured, else, promoted, the group of the primary it followed; ""
// on a first primary without one (its senders name the group by its id).
func (n *Node) pairGroup() string {
	if g := n.configuredGroup(); g != "" {
		return g
	}
	if n.agent != nil {
		if f := n.agent.Receiver.Status().Follows; f != nil {
			return f.Group
		}
	}
	return ""
}

// Server is the node's hypervisor server.
func (n *Node) Server() *hypervisor.Server { return n.srv }

// Agent is the standby's replication end (nil on a node started as
// primary).
func (n *Node) Agent() *standby.Agent { return n.agent }

// Role is the node's role and term, as its authority decided.
func (n *Node) Role() (failover.Role, uint64) { return n.auth.role() }

// Serving reports when this node began serving guests and when it was
// fenced (zero times: not yet, or not fenced).
func (n *Node) Serving() (from, until time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.servingFrom, n.servingUntil
}

// Served delivers the guest listener's end: nil after Close or a fence,
// else the accept error.
func (n *Node) Served() <-chan error { return n.served }

// serveGuests listens on the guest endpoint and serves until Close.
func (n *Node) serveGuests() error {
	ln, err := transport.Listen(n.cfg.GuestListen)
	if err != nil {
		return fmt.Errorf("listening for guests: %w", err)
	}
	n.mu.Lock()
	n.guestLn, n.servingFrom = ln, n.cfg.Now()
	n.mu.Unlock()
	go func() { n.served <- n.srv.Serve(ln) }()
	return nil
}

// CloseReplicationListener stops a standby taking new replication links
// (the current one stays up until it breaks or is closed).
func (n *Node) CloseReplicationListener() {
	if n.replLn != nil {
		n.replLn.Close()
	}
}

// Close stops the node: its authority, replication, guest service and
// replica. A unix socket it listened on is removed.
func (n *Node) Close() {
	n.cancel()
	if n.agent != nil {
		n.CloseReplicationListener()
		n.agent.Close()
	}
	n.srv.Close()
	n.mu.Lock()
	repl, ln := n.repl, n.guestLn
	n.mu.Unlock()
	if repl != nil {
		repl.stop()
	}
	n.wg.Wait()
	if n.cfg.Coordinator != nil {
		n.cfg.Coordinator.Close()
	}
	if ln != nil {
		if e, err := transport.Parse(n.cfg.GuestListen); err == nil && e.Scheme == "unix" {
			os.Remove(e.Address)
		}
	}
}

// errNotReplicating answers admin calls a node cannot serve.
var errNotReplicating = errors.New("this node is not a replicating primary (no --replicate-to, or not promoted)")
