package agent

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/placement"
	"github.com/vgpuha/vgpuha/internal/cli"
	"github.com/vgpuha/vgpuha/internal/node"
	"github.com/vgpuha/vgpuha/mmiotrace"
	"github.com/vgpuha/vgpuha/pvdriver/transport"
	"github.com/vgpuha/vgpuha/replicate/link"
)

// BackendFlags are the flags that choose and size the GPU backend
// (node.GPU opens it).
type BackendFlags struct {
	Name      string
	SimMemory uint64
	SimShift  uint64
	SimGPUs   int
	Spares    int // CUDA contexts (or GPU workers) made ahead
	// Workers is --guest.workers: on, off, or auto (on with --guest.kernels).
	Workers string
}

// Register adds the backend's flags to fs.
func (b *BackendFlags) Register(fs *flag.FlagSet) {
	cli.StringVar(fs, &b.Name, "backend", "auto", CheckBackend, "GPU backend: cuda (NVIDIA GPU 0 through the CUDA driver API; cuda:N for device N, cuda:all for every GPU of the host, "+
		"cuda:0,2 for a set, by ordinals or UUIDs as nvidia-smi -L prints them), sim (software GPU; --sim.gpus for several), or auto (cuda device 0 where a GPU is present, else sim). "+
		"A node with several GPUs places each new guest on one (--guest.placement)")
	cli.SizeVar(fs, &b.SimMemory, "sim.memory-bytes", 8<<30, 1<<20, MaxSimMemory, "device memory of each software GPU (held in host memory as guests allocate it; at most 1TiB)")
	cli.IntVar(fs, &b.SimGPUs, "sim.gpus", 1, 1, node.MaxSimGPUs, "software GPUs the node serves (--backend sim), each independent, of --sim.memory-bytes, numbered from 0")
	cli.SizeVar(fs, &b.SimShift, "sim.base-shift", 0, 0, 1<<46, "move every software-GPU window this far from the base asked for (forces address translation on a standby; for tests)")
	cli.IntVar(fs, &b.Spares, "cuda.spare-contexts", 2, 0, 64, "CUDA contexts to keep made ahead, per GPU (at most --guest.max-sessions), so a new session (a guest's, or one a standby recreates when it resyncs) need not wait ~100 ms for one; each holds a context's device memory (~0.5 GiB)")
}

// MaxSimMemory bounds --sim.memory-bytes: the software GPU keeps its
// device memory in the host's, and no host it runs on has more than this
// to give it (an H200 has 141 GB); a larger value is a typo (100TiB for
// 100GiB), refused rather than promised to guests.
const MaxSimMemory = 1 << 40

// CheckBackend accepts the --backend names node.GPU knows.
func CheckBackend(name string) error { return node.CheckGPU(name) }

func (b *BackendFlags) gpu() node.GPU {
	return node.GPU{Name: b.Name, SimMemoryBytes: b.SimMemory, SimBaseShift: b.SimShift, SimGPUs: b.SimGPUs, SpareContexts: b.Spares, Workers: b.Workers == "on"}
}

// Open opens the backend the flags chose.
func (b *BackendFlags) Open() (gpu.Backend, error) { return b.gpu().Open() }

// checkWorkers accepts --guest.workers' words.
func checkWorkers(v string) error {
	switch v {
	case "auto", "on", "off":
		return nil
	}
	return fmt.Errorf("want auto, on or off, got %q", v)
}

// workersFlag registers --guest.workers.
func workersFlag(fs *flag.FlagSet, b *BackendFlags) {
	cli.StringVar(fs, &b.Workers, "guest.workers", "off", checkWorkers, "run each guest session's GPU work in a worker process of its own (its own GPU context: "+
		"a guest's kernel reaches no other guest's memory, and a fault ends that guest's session alone): on, off, or auto (on with --guest.kernels, "+
		"whose guests bring their own kernels; sessions of the library's kernels alone share the node's process, a hop cheaper); "+
		"--guest.kernels with off needs --guest.max-sessions 1; off by default: a standby applies a worker's log one round trip per call (docs/PERFORMANCE.md)")
}

// configFlags registers the hypervisor's limits.
func configFlags(fs *flag.FlagSet, cfg *hypervisor.Config) {
	cli.SizeVar(fs, &cfg.MemoryQuota, "guest.memory-quota-bytes", cfg.MemoryQuota, 1, cli.MaxUint64, "device memory each guest may allocate")
	cli.IntVar(fs, &cfg.MaxSessions, "guest.max-sessions", cfg.MaxSessions, 1, 1<<16, "concurrent guest sessions")
	cli.IntVar(fs, &cfg.MaxStatusConns, "guest.max-status-connections", cfg.MaxStatusConns, 1, 1<<16,
		"concurrent status connections (guests' NVML watching the device, e.g. nvidia-smi, with no CUDA session in the process; not counted in --guest.max-sessions)")
	cli.StringVar(fs, (*string)(&cfg.Placement), "guest.placement", string(placement.DefaultPolicy), placement.Check,
		"how a node with several GPUs places each new guest session (a standby: each replica): most-free (the GPU with the most memory left after the quotas of the sessions there) "+
			"or fewest-guests (the GPU with the fewest sessions); a guest may pin one with VGPUHA_GPU=<index or UUID>")
	fs.BoolVar(&cfg.GuestKernels, "guest.kernels", false, "let guests load their own kernels, not only the library's (each guest's GPU work then runs in a worker process of its own: --guest.workers)")
	cli.IntVar(fs, &cfg.MaxObjects, "guest.max-objects", cfg.MaxObjects, 1, cli.MaxInt, "allocations plus handles each guest may hold")
	cli.IntVar(fs, &cfg.WindowBase, "va.base", cfg.WindowBase, 0, 1<<56, "device virtual address of the first guest's window (a multiple of 2 MiB; 0x hex accepted)")
	cli.SizeVar(fs, &cfg.WindowSize, "va.window-bytes", cfg.WindowSize, cfg.AllocAlign, 1<<46, "size of each guest's device-address window (a multiple of 2 MiB)")
	fs.Func("mmio", "how guest writes to apertures are traced: off, insn, page, auto (per page: insn, or page for pages written in streaks), uffd, kmod, kmod-page or kmod-auto (the kmod modes need the vgpuha_mmio module) (default "+cfg.MMIO.Mode.String()+")", func(v string) error {
		m, err := mmiotrace.ParseMode(v)
		cfg.MMIO.Mode = m
		return err
	})
	fs.BoolVar(&cfg.MMIO.Pin, "mmio.pin", cfg.MMIO.Pin, "insn and auto mode: pin the tracer and the traced guest's threads to one CPU (per-write tracing is 3-4x cheaper; page mode never pins)")
	cli.DurationVar(fs, &cfg.MMIO.FlushEvery, "mmio.flush-every", cfg.MMIO.FlushEvery, 0, time.Hour, "also flush aperture writes on this timer, for guests that write without calling (0: only at calls)")
	tenantFlags(fs, cfg)
}

// ReplicationModes are --mode's words (replicate.ParseMode's).
var ReplicationModes = []string{"sync", "commit", "async", "epoch"}

// CheckEndpoint accepts a guest endpoint (unix://, tcp://, vsock://,
// shm+unix://).
func CheckEndpoint(v string) error {
	_, err := transport.Parse(v)
	return err
}

// checkTCP accepts tcp://HOST:PORT; checkTCPList a comma-separated list.
func checkTCP(v string) error {
	if v == "" {
		return nil
	}
	_, err := tcpFlag("", v)
	return err
}

func checkTCPList(v string) error {
	if v == "" {
		return nil
	}
	_, err := tcpListFlag("", v)
	return err
}

// checkAdminAddr accepts HOST:PORT or unix:///PATH.
func checkAdminAddr(v string) error {
	if v == "" || strings.HasPrefix(v, "unix:///") {
		return nil
	}
	if _, _, err := net.SplitHostPort(v); err != nil || strings.Contains(v, "://") {
		return fmt.Errorf("want HOST:PORT or unix:///PATH, got %q", v)
	}
	return nil
}

// tcpFlag checks that a flag holds tcp://HOST:PORT and returns HOST:PORT.
func tcpFlag(name, value string) (string, error) {
	e, err := transport.Parse(value)
	if err != nil || e.Scheme != "tcp" {
		if name == "" {
			return "", fmt.Errorf("want tcp://HOST:PORT, got %q", value)
		}
		return "", fmt.Errorf("--%s must be tcp://HOST:PORT, got %q", name, value)
	}
	return e.Address, nil
}

// tcpListFlag parses a comma-separated list of tcp://HOST:PORT endpoints.
func tcpListFlag(name, value string) ([]string, error) {
	var out []string
	for _, v := range strings.Split(value, ",") {
		addr, err := tcpFlag(name, strings.TrimSpace(v))
		if err != nil {
			return nil, err
		}
		if slices.Contains(out, addr) {
			return nil, fmt.Errorf("%s is named twice", addr)
		}
		out = append(out, addr)
	}
	return out, nil
}

// readKey reads a pre-shared replication key file. Every way it can be
// wrong is a refused configuration (exit 2, naming the flag): missing,
// unreadable, a directory, readable by other users, or too short.
func readKey(path string) ([]byte, error) {
	const name = "--replicate.key-file"
	if path == "" {
		return nil, cli.Usage(fmt.Errorf("%s is required: the replication link accepts only peers holding the same key", name))
	}
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return nil, cli.Usage(fmt.Errorf("%s %s: %w", name, path, unwrapPath(err)))
	case fi.IsDir():
		return nil, cli.Usage(fmt.Errorf("%s %s is a directory; give the file holding the key", name, path))
	case fi.Mode().Perm()&0o007 != 0:
		return nil, cli.Usage(fmt.Errorf("%s %s is readable by other users (mode %04o): anyone who reads it can join the replication link; chmod 600 %s",
			name, path, fi.Mode().Perm(), path))
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, cli.Usage(fmt.Errorf("%s %s: %w", name, path, unwrapPath(err)))
	}
	b = bytes.TrimSpace(b)
	if len(b) < link.MinKeyBytes {
		return nil, cli.Usage(fmt.Errorf("%s: the replication key in %s is %d bytes; need at least %d (try: head -c 32 /dev/urandom | base64 > %s)",
			name, path, len(b), link.MinKeyBytes, path))
	}
	return b, nil
}

// unwrapPath is a file error without the path and operation its message
// repeats ("no such file or directory", "permission denied").
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// adminClient returns an HTTP client and base URL for a node's admin
// address (HOST:PORT or unix:///path).
func adminClient(addr string, timeout time.Duration) (*http.Client, string) {
	if path, ok := strings.CutPrefix(addr, "unix://"); ok {
		tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}}
		return &http.Client{Timeout: timeout, Transport: tr}, "http://admin"
	}
	return &http.Client{Timeout: timeout}, "http://" + addr
}

func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfoMetric())
	return reg
}
