package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/internal/workload"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/transport"
)

// runDemo starts a primary on the software GPU behind a unix socket in a
// temporary directory, and runs every example workload through pvdriver.
func runDemo(args []string) error {
	fs := newFlags("demo", "[flags]")
	size := fs.Int("size", 0, "problem size for every workload (0: defaults)")
	var bf backendFlags
	bf.register(fs)
	newLog := logFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	log := newLog()
	dir, err := os.MkdirTemp("", "vgpuha-demo")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	endpoint := "unix://" + filepath.Join(dir, "guest.sock")

	backend, err := bf.open()
	if err != nil {
		return err
	}
	srv, err := hypervisor.NewServer(backend, hypervisor.DefaultConfig(), prometheus.NewRegistry(),
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return err
	}
	ln, err := transport.Listen(endpoint)
	if err != nil {
		return err
	}
	go srv.Serve(ln)
	defer srv.Close()
	fmt.Printf("primary: %s backend, guests on %s\n", backend.Name(), endpoint)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	c, err := pvdriver.Open(ctx, endpoint, pvdriver.Options{GuestName: "demo"})
	cancel()
	if err != nil {
		return err
	}
	defer c.Close()
	base, _ := c.Window()
	fmt.Printf("guest: session %d, device window at %#x\n\n", c.Session(), base)
	ws, _ := workload.Select("all")
	start := time.Now()
	rep, err := runWorkloads(context.Background(), c, ws, *size)
	if err != nil {
		return err
	}
	printResults(os.Stdout, rep.Workloads)
	log.Debug("demo finished", "elapsed", time.Since(start))
	fmt.Printf("\n%d workloads in %v, all verified: %v\n", len(rep.Workloads), time.Since(start).Round(time.Millisecond), rep.Verified)
	if !rep.Verified {
		return fmt.Errorf("some results are wrong")
	}
	return nil
}
