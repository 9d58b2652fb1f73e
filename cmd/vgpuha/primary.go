package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/internal/admin"
	"github.com/vgpuha/vgpuha/pvdriver/transport"
)

// openBackend opens the named GPU backend.
func openBackend(name string, simMemory uint64) (gpu.Backend, error) {
	switch name {
	case "sim":
		return sim.New(simMemory), nil
	}
	return nil, fmt.Errorf("unknown backend %q (have: sim)", name)
}

func runPrimary(args []string) error {
	fs := newFlags("primary", "--guest-listen ENDPOINT [flags]")
	listen := fs.String("guest-listen", "unix:///tmp/vgpuha.sock", "endpoint guests connect to: unix:///PATH, tcp://HOST:PORT or vsock://CID|any:PORT")
	backendName := fs.String("backend", "sim", "GPU backend: sim (software GPU)")
	adminAddr := fs.String("admin-listen", "", "HOST:PORT for /metrics, /healthz and /status (off when empty)")
	simMemory := fs.Uint64("sim.memory-bytes", 8<<30, "device memory of the software GPU")
	cfg := hypervisor.DefaultConfig()
	fs.Uint64Var(&cfg.MemoryQuota, "guest.memory-quota-bytes", cfg.MemoryQuota, "device memory each guest may allocate")
	fs.IntVar(&cfg.MaxSessions, "guest.max-sessions", cfg.MaxSessions, "concurrent guest sessions")
	fs.IntVar(&cfg.MaxObjects, "guest.max-objects", cfg.MaxObjects, "allocations plus handles each guest may hold")
	fs.Uint64Var(&cfg.WindowBase, "va.base", cfg.WindowBase, "device virtual address of the first guest's window")
	fs.Uint64Var(&cfg.WindowSize, "va.window-bytes", cfg.WindowSize, "size of each guest's device-address window")
	newLog := logFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	log := newLog()
	backend, err := openBackend(*backendName, *simMemory)
	if err != nil {
		return err
	}
	defer backend.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	srv, err := hypervisor.NewServer(backend, cfg, reg, log)
	if err != nil {
		return err
	}
	ln, err := transport.Listen(*listen)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var adminSrv *http.Server
	if *adminAddr != "" {
		aln, err := net.Listen("tcp", *adminAddr)
		if err != nil {
			ln.Close()
			return fmt.Errorf("admin listener: %w", err)
		}
		adminSrv = &http.Server{Handler: admin.Handler(reg, func() any { return srv.Status() }), ReadHeaderTimeout: 5 * time.Second}
		go adminSrv.Serve(aln)
		log.Info("admin endpoint up", "addr", aln.Addr().String())
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("primary serving guests", "endpoint", *listen, "backend", backend.Name())

	select {
	case <-ctx.Done():
		log.Info("shutting down", "reason", "signal")
	case err = <-errc:
	}
	srv.Close()
	if adminSrv != nil {
		shut, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		adminSrv.Shutdown(shut)
		cancel()
	}
	if e, perr := transport.Parse(*listen); perr == nil && e.Scheme == "unix" {
		os.Remove(e.Address)
	}
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	log.Info("primary stopped")
	return nil
}
