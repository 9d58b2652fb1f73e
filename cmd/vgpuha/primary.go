package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/vgpuha/vgpuha/failover"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/internal/admin"
	"github.com/vgpuha/vgpuha/pvdriver/transport"
	"github.com/vgpuha/vgpuha/replicate"
)

// primaryStatus is the primary's /status.
type primaryStatus struct {
	Role string `json:"role"`
	hypervisor.Status
	Replication *replicate.SenderStatus `json:"replication,omitempty"`
}

func runPrimary(args []string) error {
	return servePrimary(newFlags("primary", "--guest-listen ENDPOINT [flags]"), args, nil)
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
	listen := fs.String("guest-listen", defaultListen, "endpoint guests connect to: unix:///PATH, tcp://HOST:PORT or vsock://CID|any:PORT")
	var bf backendFlags
	bf.register(fs)
	adminAddr := fs.String("admin-listen", "", "HOST:PORT for /metrics, /healthz, /status, POST /verify and POST /epoch (off when empty)")
	adminToken := adminTokenFlag(fs)
	replicateTo := fs.String("replicate-to", "", "standby to stream every state change to: tcp://HOST:PORT (off when empty)")
	modeName := fs.String("mode", "commit", "replication mode: sync, commit, async or epoch")
	keyFile := fs.String("replicate.key-file", "", "file holding the pre-shared replication key (at least 16 bytes)")
	maxLag := fs.Int64("replicate.max-lag-bytes", 256<<20, "unapplied log bytes held before guests are slowed down (the async mode's lag bound)")
	cfg := hypervisor.DefaultConfig()
	configFlags(fs, &cfg)
	newLog := logFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	log := newLog()
	backend, err := bf.open()
	if err != nil {
		return err
	}
	defer backend.Close()
	reg := newRegistry()
	srv, err := hypervisor.NewServer(backend, cfg, reg, log)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var sender *replicate.Sender
	var verifier replicate.Verifier
	var replLog *replicate.Log
	if *replicateTo != "" {
		standbyAddr, err := tcpFlag("replicate-to", *replicateTo)
		if err != nil {
			return err
		}
		mode, err := replicate.ParseMode(*modeName)
		if err != nil {
			return err
		}
		key, err := readKey(*keyFile)
		if err != nil {
			return err
		}
		replLog = replicate.NewLog(*maxLag)
		defer replLog.Close()
		srv.Replicate(replLog, mode)
		sender, err = replicate.NewSender(replicate.SenderConfig{
			Addr: standbyAddr, Key: key, Mode: mode, Log: replLog, Log_: log,
			Snapshot: srv.Snapshot, OnVerify: verifier.Deliver,
			Term: srv.Term, OnFenced: func(term uint64) {
				// The fencing rule lives in failover.Node (golden-tested).
				role := failover.NewPrimary()
				role.Term = srv.Term()
				if role.SawTerm(term); role.Role == failover.Fenced {
					srv.Fence(term)
				}
			},
		})
		if err != nil {
			return err
		}
		m, err := replicate.NewMetrics(reg, sender.Status)
		if err != nil {
			return err
		}
		sender.SetMetrics(m)
		go sender.Run(ctx)
		log.Info("replicating", "standby", standbyAddr, "mode", mode)
	}

	status := func() any {
		st := primaryStatus{Role: "primary", Status: srv.Status()}
		if sender != nil {
			ss := sender.Status()
			st.Replication = &ss
		}
		return st
	}
	mux := admin.Handler(reg, status)
	mux.HandleFunc("POST /verify", func(w http.ResponseWriter, r *http.Request) {
		if sender == nil {
			http.Error(w, "this primary does not replicate (no --replicate-to)", http.StatusConflict)
			return
		}
		rep, err := verifier.Verify(srv.VerifyPoint, 30*time.Second)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		if repair, _ := strconv.ParseBool(r.URL.Query().Get("repair")); repair && !rep.Match {
			for _, m := range rep.Mismatches {
				addr, perr := strconv.ParseUint(m.ID, 0, 64)
				if m.Repairable && perr == nil && srv.Repair(m.Session, addr) == nil {
					rep.Repaired++
				}
			}
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(rep)
	})
	mux.HandleFunc("POST /switchover", func(w http.ResponseWriter, r *http.Request) {
		if sender == nil {
			http.Error(w, "this primary does not replicate", http.StatusConflict)
			return
		}
		pause, err := srv.Switchover(func() (uint64, error) { return sender.Handover(10 * time.Second) })
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, "{\"guest_pause_ms\": %.3f, \"term\": %d}\n", float64(pause.Microseconds())/1000, srv.Term())
	})
	mux.HandleFunc("POST /epoch", func(w http.ResponseWriter, r *http.Request) {
		if replLog == nil {
			http.Error(w, "this primary does not replicate", http.StatusConflict)
			return
		}
		epoch, durable := replLog.CutEpoch()
		fmt.Fprintf(w, "{\"epoch\": %d, \"committed_on_standby\": %v}\n", epoch, durable)
	})
	if _, err := serveAdmin(ctx, *adminAddr, *adminToken, mux, log); err != nil {
		return err
	}

	ln, err := transport.Listen(*listen)
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("primary serving guests", "endpoint", *listen, "backend", backend.Name())
	var guestDone <-chan error
	if guest != nil {
		if guestDone, err = startGuestProgram(guest, *listen, cfg.MMIO); err != nil {
			srv.Close()
			return err
		}
	}
	select {
	case err = <-guestDone:
		printMMIOSummary(reg, cfg.MMIO.Mode)
	case <-ctx.Done():
		log.Info("shutting down", "reason", "signal")
	case err = <-errc:
		if err == nil && !srv.IsPrimary() {
			// Fenced: stay up so operators can see why in /status.
			log.Warn("fenced; no longer serving guests; waiting for SIGTERM")
			<-ctx.Done()
		}
	}
	srv.Close()
	if e, perr := transport.Parse(*listen); perr == nil && e.Scheme == "unix" {
		os.Remove(e.Address)
	}
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	log.Info("primary stopped")
	return nil
}
