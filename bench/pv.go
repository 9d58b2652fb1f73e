// Package bench holds vgpuha's benchmark harnesses and renders their
// reports. Each harness measures the configurations it compares side by side
// in interleaved rounds (direct, unix, tcp, shm, direct, unix, ...) and reports
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
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/cuda"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/kernels"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/pvdriver/transport"
	"github.com/vgpuha/vgpuha/pvdriver/transport/shm"
)

// PVOptions sets how long the paravirtual-call benchmark runs.
type PVOptions struct {
	Rounds int // interleaved rounds; each configuration is timed once per round
	Batch  int // operations per timing
	// Progress, when set, receives one line per round.
	Progress io.Writer
	// NewBackend makes the GPU; nil means the software GPU.
	NewBackend func() (gpu.Backend, error)
	// BulkBytes is the size of one bulk host-to-device copy (default
	// 16 MiB); each timing makes Batch/250 of them (at least one).
	BulkBytes int
	// Endpoint, when set, is a running node (a live deployment) measured
	// from this process, side by side with NewBackend called in-process,
	// instead of a hypervisor started here on every transport.
	Endpoint string
}

// PVRow is one measured configuration.
type PVRow struct {
	Op        string  `json:"op"`
	Transport string  `json:"transport"`
	NsPerOp   float64 `json:"ns_per_op"`
	// VsDirect is NsPerOp divided by the direct in-process figure for the
	// same op: how many times slower the paravirtual path is.
	VsDirect float64 `json:"vs_direct"`
	// Bytes an op moves (bulk copies only) and the rate that makes.
	Bytes    int     `json:"bytes,omitempty"`
	MBPerSec float64 `json:"mb_per_sec,omitempty"`
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
	// bulk copies BulkBytes from host memory to the device and waits;
	// bulkRead copies them back.
	bulk, bulkRead func() error
	// pinned does the same from page-locked host memory: in-process,
	// cuMemcpyHtoD from cuMemAllocHost (the software GPU has no such
	// memory: its plain copy); over shared memory, from the session's
	// host-memory region (pvdriver.Client.AllocHost). Nil elsewhere.
	pinned func() error
	// read copies 64 bytes from the device (a reply that carries data:
	// in commit mode it waits until the standby holds every change
	// before it).
	read func() error
	// memset queues a 1 KiB memset without waiting (Step).
	memset func() error
	// waited counts the requests the caller has waited for so far (nil
	// in-process, where nothing crosses a link).
	waited func() uint64
}

// PV measures the paravirtual path against calling the backend directly:
// the round trip of a small synchronous call, the throughput of pipelined
// asynchronous launches and of a bulk copy each way, over unix, tcp
// and shared memory (shm+unix, Linux only) side by side; and a bulk copy
// from page-locked memory: in-process from cuMemAllocHost's, over shared
// memory from the session's host-memory region.
func PV(opts PVOptions) ([]PVRow, error) {
	if opts.Rounds <= 0 {
		opts.Rounds = 7
	}
	if opts.Batch <= 0 {
		opts.Batch = 2000
	}
	if opts.BulkBytes <= 0 {
		opts.BulkBytes = 16 << 20
	}
	dir, err := os.MkdirTemp("", "vgpuha-bench")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	targets, closeAll, err := pvTargets(opts, dir)
	defer closeAll()
	if err != nil {
		return nil, err
	}
	bulkOps := max(1, opts.Batch/250)
	ops := []pvOp{
		{name: "sync_call_64B", n: opts.Batch, run: func(t target) error { return t.syncCall() }},
		{name: "async_launch", n: opts.Batch, run: func(t target) error { return t.launch() }, after: func(t target) error { return t.flush() }},
		{name: fmt.Sprintf("bulk_htod_%dMiB", opts.BulkBytes>>20), n: bulkOps, bytes: opts.BulkBytes, run: func(t target) error { return t.bulk() }},
		{name: fmt.Sprintf("bulk_htod_pinned_%dMiB", opts.BulkBytes>>20), n: bulkOps, bytes: opts.BulkBytes,
			run: func(t target) error { return t.pinned() }, skip: func(t target) bool { return t.pinned == nil }},
		{name: fmt.Sprintf("bulk_dtoh_%dMiB", opts.BulkBytes>>20), n: bulkOps, bytes: opts.BulkBytes, run: func(t target) error { return t.bulkRead() }},
	}
	samples := map[[2]int][]float64{}
	for round := 0; round < opts.Rounds; round++ {
		for oi, op := range ops {
			for ti, t := range targets {
				if op.skip != nil && op.skip(t) {
					continue
				}
				ns, err := op.time(t)
				if err != nil {
					return nil, fmt.Errorf("%s over %s: %w", op.name, t.transport, err)
				}
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
			if op.skip != nil && op.skip(t) {
				continue
			}
			m := median(samples[[2]int{oi, ti}])
			r := PVRow{Op: op.name, Transport: t.transport, NsPerOp: m, VsDirect: m / base, Bytes: op.bytes}
			if op.bytes > 0 {
				r.MBPerSec = float64(op.bytes) / m * 1e3
			}
			rows = append(rows, r)
		}
	}
	return rows, nil
}

// pvOp is one benchmarked operation: run n times, then after once.
type pvOp struct {
	name  string
	n     int
	bytes int
	run   func(t target) error
	after func(t target) error
	skip  func(t target) bool // targets that cannot run it (nil: none)
}

// time runs op on t and returns nanoseconds per operation.
func (op pvOp) time(t target) (float64, error) {
	start := time.Now()
	for range op.n {
		if err := op.run(t); err != nil {
			return 0, err
		}
	}
	if op.after != nil {
		if err := op.after(t); err != nil {
			return 0, err
		}
	}
	return float64(time.Since(start).Nanoseconds()) / float64(op.n), nil
}

// pvTargets starts a hypervisor on the backend and returns the direct
// target and one client per transport; closeAll releases everything
// (call it even on error).
func pvTargets(opts PVOptions, dir string) (targets []target, closeAll func(), err error) {
	var closers []func()
	closeAll = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	if opts.NewBackend == nil {
		opts.NewBackend = func() (gpu.Backend, error) { return sim.New(1 << 30), nil }
	}
	backend, err := opts.NewBackend()
	if err != nil {
		return nil, closeAll, err
	}
	targets, release, err := directTargets(backend, opts.BulkBytes)
	if err != nil {
		return nil, closeAll, err
	}
	closers = append(closers, release)
	if opts.Endpoint != "" {
		for _, spec := range strings.Split(opts.Endpoint, ",") {
			name, ep, named := strings.Cut(spec, "=")
			if !named {
				ep = spec
			}
			t, closer, err := clientTarget(ep, opts.BulkBytes)
			if err != nil {
				return nil, closeAll, fmt.Errorf("live endpoint %s: %w", ep, err)
			}
			t.transport = "live-" + t.transport
			if named {
				t.transport = name
			}
			closers = append(closers, closer)
			targets = append(targets, t)
		}
		return targets, closeAll, nil
	}
	cfg := hypervisor.DefaultConfig()
	// The benchmark's guests reach the node as several tenants (a uid over
	// unix sockets, an address over TCP): leave the device's memory to its
	// own allocator, it measures calls, not admission.
	cfg.TenantOvercommit = true
	srv, err := hypervisor.NewServer(backend, cfg, prometheus.NewRegistry(),
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return nil, closeAll, err
	}
	closers = append(closers, func() { srv.Close() })
	endpoints := []string{"unix://" + filepath.Join(dir, "g.sock"), "tcp://127.0.0.1:0"}
	if runtime.GOOS == "linux" {
		endpoints = append(endpoints, "shm+unix://"+filepath.Join(dir, "s.sock"))
	}
	for _, ep := range endpoints {
		ln, err := transport.Listen(ep)
		if err != nil {
			return nil, closeAll, err
		}
		go srv.Serve(ln)
		if strings.HasPrefix(ep, "tcp:") {
			ep = "tcp://" + ln.Addr().String()
		}
		t, closer, err := clientTarget(ep, opts.BulkBytes)
		if err != nil {
			return nil, closeAll, err
		}
		closers = append(closers, closer)
		targets = append(targets, t)
	}
	return targets, closeAll, nil
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// directTargets calls a backend context in-process: the floor any
// paravirtual path is compared with. On CUDA its pinned copy is
// cuMemcpyHtoD from cuMemAllocHost, the fastest a host-to-device copy
// runs; release frees that buffer.
func directTargets(backend gpu.Backend, bulkBytes int) (targets []target, release func(), err error) {
	release = func() {}
	t, ctx, bulkAt, err := directTarget(backend, bulkBytes)
	if err != nil {
		return nil, release, err
	}
	t.pinned = t.bulk // the software GPU: no page-locked memory
	if cb, ok := backend.(*cuda.Backend); ok {
		if t.pinned, release, err = cb.PinnedCopy(ctx, bulkAt, bulkBytes); err != nil {
			return nil, func() {}, err
		}
	}
	return []target{t}, release, nil
}

// directTarget is the in-process target on a fresh context of backend;
// bulkAt is where its bulk copies go.
func directTarget(backend gpu.Backend, bulkBytes int) (t target, ctx gpu.Context, bulkAt uint64, err error) {
	ctx, err = backend.NewContext(0x7f0000000000, 1<<30+uint64(bulkBytes))
	if err != nil {
		return target{}, nil, 0, err
	}
	base, _ := ctx.Window()
	if err := ctx.Alloc(base, 2<<20); err != nil {
		return target{}, nil, 0, err
	}
	bulkAt = base + 4<<20
	if err := ctx.Alloc(bulkAt, uint64(bulkBytes)); err != nil {
		return target{}, nil, 0, err
	}
	bulk := make([]byte, bulkBytes)
	img, _ := kernels.Image("vadd")
	mi, _ := abi.DecodeModuleImage(img)
	m, err := ctx.LoadModule(mi)
	if err != nil {
		return target{}, nil, 0, err
	}
	f, err := ctx.Function(m, "vadd")
	if err != nil {
		return target{}, nil, 0, err
	}
	payload := make([]byte, 64)
	args := []abi.Arg{abi.Ptr(base), abi.Ptr(base + 4096), abi.Ptr(base + 8192), abi.U32(256)}
	cfg := gpu.LaunchConfig{Grid: abi.Dim3{X: 1, Y: 1, Z: 1}, Block: abi.Dim3{X: 256, Y: 1, Z: 1}}
	return target{
		transport: "direct-" + backend.Name(),
		syncCall:  func() error { return ctx.CopyHtoD(base, payload, 0) },
		launch:    func() error { return ctx.Launch(f, cfg, args, 0) },
		flush:     ctx.Sync,
		bulk:      func() error { return ctx.CopyHtoD(bulkAt, bulk, 0) },
		bulkRead:  func() error { return ctx.CopyDtoH(bulk, bulkAt, 0) },
		read:      func() error { return ctx.CopyDtoH(payload, base, 0) },
		memset:    func() error { return ctx.Memset(base+12288, 4, 0, 256, 0) },
	}, ctx, bulkAt, nil
}

func clientTarget(endpoint string, bulkBytes int) (target, func(), error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := pvdriver.Open(ctx, withHostMemory(endpoint, bulkBytes), pvdriver.Options{GuestName: "bench"})
	if err != nil {
		return target{}, nil, err
	}
	p, err := c.Alloc(1 << 20)
	if err != nil {
		return target{}, nil, err
	}
	bulkAt, err := c.Alloc(uint64(bulkBytes))
	if err != nil {
		return target{}, nil, err
	}
	bulk := make([]byte, bulkBytes)
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
	t := target{
		transport: endpoint[:strings.Index(endpoint, ":")],
		syncCall:  func() error { return c.CopyHtoD(p, payload) },
		launch:    func() error { return c.Launch(f, cfg, args...) },
		flush:     c.Synchronize,
		bulk:      func() error { return c.CopyHtoD(bulkAt, bulk) },
		bulkRead:  func() error { return c.CopyDtoH(bulk, bulkAt) },
		read:      func() error { return c.CopyDtoH(payload, p) },
		memset:    func() error { return c.Memset(p+12288, 4, 0, 256, 0, false) },
		waited: func() (n uint64) {
			for _, s := range c.Stats() {
				n += s.Waited
			}
			return n
		},
	}
	if pinned, err := c.AllocHost(bulkBytes); err == nil {
		copy(pinned, bulk) // touched before it is timed
		t.pinned = func() error { return c.CopyHtoD(bulkAt, pinned) }
	}
	return t, func() { c.Close() }, nil
}

// withHostMemory asks a shared-memory endpoint that names no host-memory
// region for one that holds a bulk copy's buffer.
func withHostMemory(endpoint string, bulkBytes int) string {
	e, err := transport.Parse(endpoint)
	if err != nil || e.Scheme != "shm+unix" || e.HostMemory != 0 {
		return endpoint
	}
	e.HostMemory = int64(max(bulkBytes, shm.DefaultHostMemory))
	return e.String()
}

// PrintPV writes the report as a table.
func PrintPV(w io.Writer, rows []PVRow) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "op\ttransport\tns/op\tops/s\tMB/s\tvs direct\t")
	for _, r := range rows {
		rate := "-"
		if r.MBPerSec > 0 {
			rate = fmt.Sprintf("%.0f", r.MBPerSec)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.0f\t%s\t%.2fx\t\n", r.Op, r.Transport, r.NsPerOp, 1e9/r.NsPerOp, rate, r.VsDirect)
	}
	tw.Flush()
}
