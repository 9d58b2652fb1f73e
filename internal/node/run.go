package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/vgpuha/vgpuha/failover"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/internal/admin"
	"github.com/vgpuha/vgpuha/internal/coordinator"
)

// RunConfig is a node's whole life in a process (vgpuha primary, standby
// and run): what Run opens, dials, serves and closes around the node. The
// caller binds the addresses first (so a taken one stops it before the GPU
// opens) and parses its flags; Run does the rest.
type RunConfig struct {
	// Node is the node's own configuration; Run fills in its Backend,
	// Detector, Coordinator and Registry from the fields below.
	Node Config
	// Registry holds the node's metrics, served on /metrics.
	Registry admin.Registry
	// Standby starts the node as a standby taking the primary's stream on
	// Replication; otherwise it starts as the first primary.
	Standby     bool
	Replication net.Listener
	// GPU is the backend Run opens, and closes when the node has stopped.
	GPU GPU
	// Detector names a standby's failure detector (failover.New).
	Detector string
	// Etcd, when set, is the coordinator Run dials (its Registry and
	// Logger are the node's).
	Etcd *coordinator.Config
	// Admin serves /metrics, /healthz, /status and the admin POSTs (nil:
	// none), with the tokens in AdminTokenFile, read again on SIGHUP.
	Admin          net.Listener
	AdminTokenFile string
	// OnServe runs once the node has started, before it reports ready; an
	// error stops it (the deposed-primary record).
	OnServe func(*Node) error
	// OnReady runs once the node reported ready; the channel it returns
	// (nil: none) ends the node with its error (vgpuha run: the guest
	// program's exit).
	OnReady func() (<-chan error, error)
	// OnFenced hears the term a primary was fenced under, when it was.
	OnFenced func(term uint64)
}

// Run runs a node until ctx ends, or, as primary, until its guest
// listener ends or OnReady's channel delivers. A primary that is fenced
// stays up (so operators can read why in /status) until ctx ends.
func Run(ctx context.Context, rc RunConfig) error {
	log := rc.Node.Logger
	rc.Node.Registry = rc.Registry
	backend, err := rc.GPU.Open()
	if err != nil {
		return err
	}
	defer backend.Close()
	rc.Node.Backend = backend
	n, err := start(&rc)
	if err != nil {
		return err
	}
	defer n.Close()
	done, stopAdmin, err := rc.ready(n)
	if err != nil {
		return err
	}
	defer stopAdmin()
	err = rc.wait(ctx, n, done)
	n.Close()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	log.Info(rc.role() + " stopped")
	return nil
}

// start dials the coordinator, makes the detector and starts the node in
// its role.
func start(rc *RunConfig) (*Node, error) {
	var err error
	if rc.Etcd != nil {
		c := *rc.Etcd
		c.Registry, c.Logger = rc.Node.Registry, rc.Node.Logger
		if rc.Node.Coordinator, err = coordinator.Dial(c); err != nil {
			return nil, err
		}
	}
	if !rc.Standby {
		return StartPrimary(rc.Node)
	}
	if rc.Node.Detector, err = failover.New(rc.Detector); err != nil {
		return nil, fmt.Errorf("failure detector: %w", err)
	}
	return StartStandby(rc.Node, rc.Replication)
}

func (rc *RunConfig) role() string {
	if rc.Standby {
		return "standby"
	}
	return "primary"
}

// ready runs OnServe, serves the admin endpoint, reloads its tokens on
// SIGHUP, tells systemd the node is ready and runs OnReady.
func (rc *RunConfig) ready(n *Node) (done <-chan error, stopAdmin func(), err error) {
	log := rc.Node.Logger
	if rc.OnServe != nil {
		if err := rc.OnServe(n); err != nil {
			return nil, nil, err
		}
	}
	mux := n.AdminHandler(rc.Registry)
	if stopAdmin, err = serveAdmin(rc.Admin, rc.AdminTokenFile, mux, log); err != nil {
		return nil, nil, err
	}
	if rc.Standby {
		log.Info("standby waiting for the primary's stream", "listen", rc.Replication.Addr().String(), "backend", rc.Node.Backend.Name(), "gpus", len(gpu.DevicesOf(rc.Node.Backend)), "takes_over_on", rc.Node.GuestListen)
	} else {
		log.Info("primary serving guests", "endpoint", rc.Node.GuestListen, "backend", rc.Node.Backend.Name(), "gpus", len(gpu.DevicesOf(rc.Node.Backend)))
	}
	reloadOnHUP(log, rc.Admin != nil, rc.AdminTokenFile, mux)
	notifyReady(log)
	if rc.OnReady != nil {
		done, err = rc.OnReady()
	}
	return done, stopAdmin, err
}

// wait returns when the node should stop: ctx ends, done delivers, or, on
// a primary, the guest listener ends (a fenced primary waits for ctx).
func (rc *RunConfig) wait(ctx context.Context, n *Node, done <-chan error) error {
	served := n.Served()
	if rc.Standby {
		served = nil // a standby runs until it is stopped, promoted or not
	}
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		warnReplicatedStop(n, rc.Node.Logger)
		rc.Node.Logger.Info("shutting down", "reason", "signal")
	case err = <-served:
		if role, term := n.Role(); err == nil && role == failover.Fenced {
			rc.fenced(term)
			rc.Node.Logger.Warn("fenced; no longer serving guests; waiting for SIGTERM")
			<-ctx.Done()
		}
	}
	if role, term := n.Role(); role == failover.Fenced && !rc.Standby {
		rc.fenced(term)
	}
	return err
}

// warnReplicatedStop says, when a serving primary with standbys is
// stopped (systemctl stop or restart), what follows: a standby takes
// over, and this node comes back deposed. A planned handover is a
// switchover.
func warnReplicatedStop(n *Node, log *slog.Logger) {
	role, term := n.Role()
	if role != failover.Primary || n.replication() == nil {
		return
	}
	log.Warn("stopping a replicated primary: its standby will take over when the heartbeats stop, and this node will come back deposed "+
		"(under a two-node pair with --state-dir it refuses to start as primary, exit 3; rejoin it as the new primary's standby). "+
		"For a planned handover with nothing lost, run vgpuha switchover before stopping it",
		"term", term, "standbys", strings.Join(n.cfg.ReplicateTo, ","))
}

func (rc *RunConfig) fenced(term uint64) {
	if rc.OnFenced != nil {
		rc.OnFenced(term)
	}
}

// serveAdmin serves mux on ln (nil: no admin endpoint) until stop.
// tokenFile holds the admin token (package admin says what it guards).
func serveAdmin(ln net.Listener, tokenFile string, mux *admin.Mux, log *slog.Logger) (stop func(), err error) {
	if ln == nil {
		return func() {}, nil
	}
	if _, err := mux.LoadToken(tokenFile); err != nil {
		ln.Close()
		return nil, err
	}
	mux.SetLogger(log)
	if ln.Addr().Network() == "tcp" && tokenFile == "" {
		log.Warn("no --admin.token-file: POST endpoints are refused over tcp and /status hides session details")
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	log.Info("admin endpoint up", "addr", ln.Addr().String())
	return func() {
		shut, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		srv.Shutdown(shut)
		cancel()
	}, nil
}

// notifyReady tells systemd (Type=notify units, contrib/systemd) that the
// node serves; without $NOTIFY_SOCKET it does nothing.
func notifyReady(log *slog.Logger) {
	if _, err := daemon.SdNotify(false, daemon.SdNotifyReady); err != nil {
		log.Warn("could not tell systemd the node is ready", "err", err)
	}
}

// reloadOnHUP makes SIGHUP (a reload request, or a closed terminal)
// reload the admin token file, the one thing read again (token rotation:
// docs/OPERATIONS.md); everything else is read at start. A file that
// cannot be read keeps the tokens in use, and the log says why.
func reloadOnHUP(log *slog.Logger, withAdmin bool, tokenFile string, mux *admin.Mux) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		for range hup {
			if !withAdmin || tokenFile == "" {
				log.Info("SIGHUP: nothing to reload (no --admin.token-file; other flags are read at start); ignored")
				continue
			}
			if n, err := mux.LoadToken(tokenFile); err != nil {
				log.Error("SIGHUP: admin tokens not reloaded; the ones in use stay", "err", err)
			} else {
				log.Info("SIGHUP: admin tokens reloaded (other flags are read at start)", "file", tokenFile, "tokens", n)
			}
		}
	}()
}
