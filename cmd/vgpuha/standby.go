package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/vgpuha/vgpuha/failover"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/internal/node"
	"github.com/vgpuha/vgpuha/replicate"
)

func runStandby(args []string) error {
	fs := newFlags("standby", "--listen tcp://HOST:PORT --replicate.key-file FILE [flags]")
	listen := stringFlag(fs, "listen", "tcp://127.0.0.1:7071", checkTCP, "where the primary's replication stream connects: tcp://HOST:PORT")
	keyFile := fs.String("replicate.key-file", "", "file holding the pre-shared replication key (the primary's)")
	adminAddr := stringFlag(fs, "admin-listen", "", checkAdminAddr, "HOST:PORT for /metrics, /healthz and /status (off when empty)")
	adminToken := adminTokenFlag(fs)
	guestListen := stringFlag(fs, "guest-listen", "", checkEndpoint, "endpoint to serve guests on once promoted; empty: never take over (a pure replica)")
	next := stringFlag(fs, "replicate-to", "", checkTCPList, "once promoted, replicate to these next standbys: tcp://HOST:PORT[,...] (same key; under --coordinator also to the group's other standbys)")
	minInSync := intFlag(fs, "replicate.min-in-sync", 1, 1, 64, "k once promoted: replies the mode holds wait for the first k caught-up standbys")
	modeName := choiceFlag(fs, "mode", "commit", replicationModes, "replication mode once promoted")
	detector := choiceFlag(fs, "failover.detector", "fixed", []string{"fixed", "phi"}, "failure detector: fixed (300 ms without a heartbeat) or phi (phi-accrual, threshold 8: about 300 ms on a steady link)")
	advertise := stringFlag(fs, "coordinator.advertise", "", checkTCP, "tcp://HOST:PORT primaries reach --listen at (the group's records name it; default: --listen)")
	var cf coordFlags
	cf.register(fs, true)
	var pair pairFlags
	pair.register(fs, true)
	var bf backendFlags
	bf.register(fs)
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
	det, err := failover.New(*detector)
	if err != nil {
		return fmt.Errorf("--failover.detector: %w", err)
	}
	key, err := readKey(*keyFile)
	if err != nil {
		return err
	}
	listenAddr, err := tcpFlag("listen", *listen)
	if err != nil {
		return err
	}
	ln, adminLn, err := bindStandbyAddresses(*guestListen, listenAddr, *adminAddr)
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
	ncfg := node.Config{Backend: backend, Hypervisor: cfg, Registry: reg, Logger: log, GuestListen: *guestListen, Key: key}
	ncfg.Detector = det
	pair.apply(&ncfg)
	if ncfg.Mode, err = replicate.ParseMode(*modeName); err != nil {
		return err
	}
	ncfg.MinInSync = *minInSync
	if *next != "" {
		if ncfg.ReplicateTo, err = tcpListFlag("replicate-to", *next); err != nil {
			return err
		}
	}
	adv := listenAddr
	if *advertise != "" {
		if adv, err = tcpFlag("coordinator.advertise", *advertise); err != nil {
			return err
		}
	}
	if ncfg.Coordinator, err = cf.dial(log, reg, adv); err != nil {
		return err
	}
	n, err := node.StartStandby(ncfg, ln)
	if err != nil {
		return err
	}
	defer n.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	mux := n.AdminHandler(reg)
	if err := serveAdmin(ctx, adminLn, *adminToken, mux, log); err != nil {
		return err
	}
	reloadOnHUP(log, *adminAddr, *adminToken, mux)
	notifyReady(log)
	log.Info("standby waiting for the primary's stream", "listen", ln.Addr().String(), "backend", backend.Name(), "takes_over_on", *guestListen)
	<-ctx.Done()
	n.Close()
	log.Info("standby stopped")
	return nil
}

// bindStandbyAddresses binds a standby's replication and admin addresses
// and tries its guest endpoint (served once promoted; listen.go).
func bindStandbyAddresses(guestListen, replicationAddr, adminAddr string) (replication, admin net.Listener, err error) {
	if guestListen != "" {
		if err := tryListen("guest-listen", guestListen); err != nil {
			return nil, nil, err
		}
	}
	if replication, err = listenTCP("listen", replicationAddr); err != nil {
		return nil, nil, err
	}
	if admin, err = listenAdmin(adminAddr); err != nil {
		replication.Close()
		return nil, nil, err
	}
	return replication, admin, nil
}
