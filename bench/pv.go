// Package bench holds vgpuha's benchmark harnesses and renders their
// reports. Each harness measures the configurations it compares side by side
// in interleaved rounds (direct, unix, tcp, direct, unix, ...) and reports
// medians, so a noisy neighbour slows every configuration alike and the
// ratios stay meaningful on a shared 2-core machine.
//
// It never asserts a speed: it prints figures. Tests check only that a
// harness runs and reports sane numbers.
package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/internal/kernels"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// PVOptions sets how long the paravirtual-call benchmark runs.
type PVOptions struct {
	Rounds int // interleaved rounds; each configuration is timed once per round
	Batch  int // operations per timing
	// Progress, when set, receives one line per round.
	Progress io.Writer
	// NewBackend makes the GPU; nil means the software GPU.
	NewBackend func() (gpu.Backend, error)
}

// PVRow is one measured configuration.
type PVRow struct {
	Op        string  `json:"op"`
	Transport string  `json:"transport"`
	NsPerOp   float64 `json:"ns_per_op"`
	// VsDirect is NsPerOp divided by the direct in-process figure for the
	// same op: how many times slower the paravirtual path is.
	VsDirect float64 `json:"vs_direct"`
}

// target is one way of issuing the benchmarked operations.
type target struct {
	transport string
	// syncCall does one small synchronous call (a 64-byte host-to-device
	// copy that waits for completion).
	syncCall func() error
	// launch queues one small kernel launch; flush waits for all of them.
	launch func() error
	flush  func() error
}

// PV measures the paravirtual path against calling the software GPU
// directly: the round trip of a small synchronous call, and the throughput
// of pipelined asynchronous launches.
func PV(opts PVOptions) ([]PVRow, error) {
	if opts.Rounds <= 0 {
		opts.Rounds = 7
	}
	if opts.Batch <= 0 {
		opts.Batch = 2000
	}
	dir, err := os.MkdirTemp("", "vgpuha-bench")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if opts.NewBackend == nil {
		opts.NewBackend = func() (gpu.Backend, error) { return sim.New(1 << 30), nil }
	}
	backend, err := opts.NewBackend()
	if err != nil {
		return nil, err
	}
	srv, err := hypervisor.NewServer(backend, hypervisor.DefaultConfig(), prometheus.NewRegistry(),
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	unixLn, err := net.Listen("unix", filepath.Join(dir, "g.sock"))
	if err != nil {
		return nil, err
	}
	tcpLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go srv.Serve(unixLn)
	go srv.Serve(tcpLn)

	direct, err := directTarget(backend)
	if err != nil {
		return nil, err
	}
	targets := []target{direct}
	for _, ep := range []string{"unix://" + unixLn.Addr().String(), "tcp://" + tcpLn.Addr().String()} {
		t, closer, err := clientTarget(ep)
		if err != nil {
			return nil, err
		}
		defer closer()
		targets = append(targets, t)
	}

	ops := []struct {
		name string
		run  func(t target, n int) error
	}{
		{"sync_call_64B", func(t target, n int) error {
			for range n {
				if err := t.syncCall(); err != nil {
					return err
				}
			}
			return nil
		}},
		{"async_launch", func(t target, n int) error {
			for range n {
				if err := t.launch(); err != nil {
					return err
				}
			}
			return t.flush()
		}},
	}
	samples := map[[2]int][]float64{}
	for round := 0; round < opts.Rounds; round++ {
		for oi, op := range ops {
			for ti, t := range targets {
				start := time.Now()
				if err := op.run(t, opts.Batch); err != nil {
					return nil, fmt.Errorf("%s over %s: %w", op.name, t.transport, err)
				}
				ns := float64(time.Since(start).Nanoseconds()) / float64(opts.Batch)
				samples[[2]int{oi, ti}] = append(samples[[2]int{oi, ti}], ns)
			}
		}
		if opts.Progress != nil {
			fmt.Fprintf(opts.Progress, "round %d/%d done\n", round+1, opts.Rounds)
		}
	}
	var rows []PVRow
	for oi, op := range ops {
		base := median(samples[[2]int{oi, 0}])
		for ti, t := range targets {
			m := median(samples[[2]int{oi, ti}])
			rows = append(rows, PVRow{Op: op.name, Transport: t.transport, NsPerOp: m, VsDirect: m / base})
		}
	}
	return rows, nil
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// directTarget calls a backend context in-process: the floor any
// paravirtual path is compared with.
func directTarget(backend gpu.Backend) (target, error) {
	ctx, err := backend.NewContext(0x7f0000000000, 1<<30)
	if err != nil {
		return target{}, err
	}
	base, _ := ctx.Window()
	if err := ctx.Alloc(base, 2<<20); err != nil {
		return target{}, err
	}
	img, _ := kernels.Image("vadd")
	mi, _ := abi.DecodeModuleImage(img)
	m, err := ctx.LoadModule(mi)
	if err != nil {
		return target{}, err
	}
	f, err := ctx.Function(m, "vadd")
	if err != nil {
		return target{}, err
	}
	payload := make([]byte, 64)
	args := []abi.Arg{abi.Ptr(base), abi.Ptr(base + 4096), abi.Ptr(base + 8192), abi.U32(256)}
	cfg := gpu.LaunchConfig{Grid: abi.Dim3{X: 1, Y: 1, Z: 1}, Block: abi.Dim3{X: 256, Y: 1, Z: 1}}
	return target{
		transport: "direct-" + backend.Name(),
		syncCall:  func() error { return ctx.CopyHtoD(base, payload, 0) },
		launch:    func() error { return ctx.Launch(f, cfg, args, 0) },
		flush:     ctx.Sync,
	}, nil
}

func clientTarget(endpoint string) (target, func(), error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := pvdriver.Open(ctx, endpoint, pvdriver.Options{GuestName: "bench"})
	if err != nil {
		return target{}, nil, err
	}
	p, err := c.Alloc(1 << 20)
	if err != nil {
		return target{}, nil, err
	}
	img, _ := kernels.Image("vadd")
	m, err := c.LoadModule(img)
	if err != nil {
		return target{}, nil, err
	}
	f, err := c.GetFunction(m, "vadd")
	if err != nil {
		return target{}, nil, err
	}
	payload := make([]byte, 64)
	cfg := pvdriver.LaunchConfig{Grid: pvdriver.Dim(1), Block: pvdriver.Dim(256)}
	args := []abi.Arg{pvdriver.Ptr(p), pvdriver.Ptr(p + 4096), pvdriver.Ptr(p + 8192), pvdriver.U32(256)}
	return target{
		transport: endpoint[:strings.Index(endpoint, ":")],
		syncCall:  func() error { return c.CopyHtoD(p, payload) },
		launch:    func() error { return c.Launch(f, cfg, args...) },
		flush:     c.Synchronize,
	}, func() { c.Close() }, nil
}

// PrintPV writes the report as a table.
func PrintPV(w io.Writer, rows []PVRow) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "op\ttransport\tns/op\tops/s\tvs direct\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.0f\t%.1fx\t\n", r.Op, r.Transport, r.NsPerOp, 1e9/r.NsPerOp, r.VsDirect)
	}
	tw.Flush()
}
