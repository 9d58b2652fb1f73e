package main

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/vgpuha/vgpuha/failover"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/internal/node"
	"github.com/vgpuha/vgpuha/replicate"
)

// primaryReplication sets a primary's standbys, key, mode and k from its
// flags.
func primaryReplication(ncfg *node.Config, replicateTo, keyFile, modeName string, minInSync int) error {
	var err error
	if replicateTo != "" {
		if ncfg.ReplicateTo, err = tcpListFlag("replicate-to", replicateTo); err != nil {
			return err
		}
		if ncfg.Key, err = readKey(keyFile); err != nil {
			return err
		}
	}
	if ncfg.Mode, err = replicate.ParseMode(modeName); err != nil {
		return err
	}
	ncfg.MinInSync = minInSync
	return nil
}

func runPrimary(args []string) error {
	return servePrimary(newFlags("primary", "--guest-listen ENDPOINT [flags]"), args, nil)
}

// primaryFlags are a primary's own flags (the backend's, the
// hypervisor's, the coordinator's and the log's are registered beside
// them).
type primaryFlags struct {
	listen, adminAddr, adminToken, replicateTo, modeName, keyFile, stateDir *string
	minInSync                                                               *int
	maxLag, resyncBudget, resyncRate                                        *int64
	guestShare                                                              float64
	resyncStall                                                             *time.Duration
}

func (p *primaryFlags) register(fs *flag.FlagSet, defaultListen string) {
	p.listen = stringFlag(fs, "guest-listen", defaultListen, checkEndpoint, "endpoint guests connect to: unix:///PATH, tcp://HOST:PORT or vsock://CID|any:PORT")
	p.adminAddr = stringFlag(fs, "admin-listen", "", checkAdminAddr, "HOST:PORT (or unix:///PATH) for /metrics, /healthz, /status, POST /verify and POST /epoch (off when empty)")
	p.adminToken = adminTokenFlag(fs)
	p.replicateTo = stringFlag(fs, "replicate-to", "", checkTCPList, "standbys to stream every state change to, in priority order: tcp://HOST:PORT[,tcp://HOST:PORT...] (off when empty)")
	p.minInSync = intFlag(fs, "replicate.min-in-sync", 1, 1, 64, "k: replies the mode holds wait for the first k caught-up standbys; with fewer, for those there are (under --coordinator once etcd records it)")
	p.modeName = choiceFlag(fs, "mode", "commit", replicationModes, "replication mode: sync, commit, async or epoch")
	p.keyFile = fs.String("replicate.key-file", "", "file holding the pre-shared replication key (at least 16 bytes)")
	p.maxLag = sizeFlag[int64](fs, "replicate.max-lag-bytes", 256<<20, 1<<20, maxInt64, "unapplied log bytes held before guests are slowed down (the async mode's lag bound)")
	p.resyncBudget = sizeFlag[int64](fs, "replicate.resync-budget-bytes", 0, 0, maxInt64, "log bytes kept while a resync streams (0: a quarter of the snapshot, at least 1 GiB): guests write half of it freely, the rest as the snapshot goes out (each write waits at most --replicate.resync-stall for it), then wait for the stream; only a single write larger than it restarts the resync")
	fractionVar(fs, &p.guestShare, "replicate.resync-guest-share", 0, 0, 1, "most of the link guests' writes take while a standby joins, 0 to 1 (0: half the resync budget at once, the rest as the snapshot goes out)")
	p.resyncStall = durationFlag(fs, "replicate.resync-stall", replicate.DefaultResyncStall, time.Millisecond, time.Minute, "longest one guest write waits for a resync's snapshot stream to earn it room in the log (the bound on a guest call's slowdown while a standby joins, whatever the memory size)")
	p.resyncRate = sizeFlag[int64](fs, "replicate.resync-rate", 0, 0, maxInt64, "bytes per second a resync streams at most (0: as fast as the link takes it)")
	p.stateDir = stateDirFlag(fs)
}

// servePrimary runs a primary until a signal, or, with a guest program,
// until that program exits (vgpuha run).
func servePrimary(fs *flag.FlagSet, args []string, guest []string) error {
	defaultListen := "unix:///tmp/vgpuha.sock"
	if guest != nil {
		dir, err := os.MkdirTemp("", "vgpuha-run")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		defaultListen = "unix://" + dir + "/guest.sock"
	}
	var pf primaryFlags
	pf.register(fs, defaultListen)
	var bf backendFlags
	bf.register(fs)
	var cf coordFlags
	cf.register(fs, true)
	var pair pairFlags
	pair.register(fs, false)
	cfg := hypervisor.DefaultConfig()
	configFlags(fs, &cfg)
	newLog := logFlag(fs)
	configPath := configFlag(fs)
	showConfig := fs.Bool("config.show", false, "print every flag's effective value and where it came from (flag, env, file, default), then exit")
	source, err := parseWithConfig(fs, args, configPath)
	if err != nil || *showConfig {
		if err == nil {
			printConfig(fs, source)
		}
		return err
	}
	log := newLog()
	record := pairRecord(*pf.stateDir, *pf.replicateTo, cf.url)
	if err := record.refuseIfDeposed(); err != nil {
		return err
	}
	if err := tryListen("guest-listen", *pf.listen); err != nil {
		return err
	}
	adminLn, err := listenAdmin(*pf.adminAddr)
	if err != nil {
		return err
	}
	bf.spares = min(bf.spares, cfg.MaxSessions) // no more contexts ahead than sessions that could take them
	backend, err := bf.open()
	if err != nil {
		return err
	}
	defer backend.Close()
	reg := newRegistry()
	ncfg := node.Config{Backend: backend, Hypervisor: cfg, Registry: reg, Logger: log, GuestListen: *pf.listen, MaxLagBytes: *pf.maxLag,
		ResyncBudgetBytes: *pf.resyncBudget, ResyncStall: *pf.resyncStall, ResyncGuestShare: pf.guestShare, ResyncRate: *pf.resyncRate}
	if err := primaryReplication(&ncfg, *pf.replicateTo, *pf.keyFile, *pf.modeName, *pf.minInSync); err != nil {
		return err
	}
	if ncfg.Coordinator, err = cf.dial(log, reg, ""); err != nil {
		return err
	}
	ncfg.StandbyLossAfter = cf.standbyLossAfter
	pair.apply(&ncfg)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	n, err := node.StartPrimary(ncfg)
	if err != nil {
		return err
	}
	defer n.Close()
	if err := record.serving(n, log); err != nil {
		return err
	}
	mux := n.AdminHandler(reg)
	if err := serveAdmin(ctx, adminLn, *pf.adminToken, mux, log); err != nil {
		return err
	}
	log.Info("primary serving guests", "endpoint", *pf.listen, "backend", backend.Name())
	reloadOnHUP(log, *pf.adminAddr, *pf.adminToken, mux)
	notifyReady(log)
	var guestDone <-chan error
	if guest != nil {
		if guestDone, err = startGuestProgram(guest, *pf.listen, cfg.MMIO); err != nil {
			return err
		}
	}
	return waitPrimary(ctx, n, guestDone, func() { printMMIOSummary(reg, cfg.MMIO.Mode) }, &record, log)
}

// waitPrimary serves until a signal, the guest program's end (then
// summary), or a fence, after which the node stays up so operators can
// see why in /status; the record notes the fence.
func waitPrimary(ctx context.Context, n *node.Node, guestDone <-chan error, summary func(), record *pairState, log *slog.Logger) error {
	var err error
	select {
	case err = <-guestDone:
		summary()
	case <-ctx.Done():
		log.Info("shutting down", "reason", "signal")
	case err = <-n.Served():
		if role, term := n.Role(); err == nil && role == failover.Fenced {
			record.fenced(term, log)
			log.Warn("fenced; no longer serving guests; waiting for SIGTERM")
			<-ctx.Done()
		}
	}
	if role, term := n.Role(); role == failover.Fenced {
		record.fenced(term, log)
	}
	n.Close()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	log.Info("primary stopped")
	return nil
}
