package labcmd

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vgpuha/vgpuha/bench"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/internal/agent"
	"github.com/vgpuha/vgpuha/internal/cli"
	"github.com/vgpuha/vgpuha/internal/lab/drill"
)

// benchmarks are bench's subcommands.
var benchmarks = map[string]cli.Command{
	"pv":        {Summary: "guest calls through pvdriver over each transport", Run: runBenchPV},
	"replicate": {Summary: "replication throughput and latency per mode", Run: runBenchReplicate},
	"resync":    {Summary: "resyncing a standby under guest load", Run: runBenchResync},
	"apply":     {Summary: "the standby's apply rate", Run: runBenchApply},
	"mmio":      {Summary: "aperture write tracing per mode", Run: runBenchMMIO},
	"fairness":  {Summary: "a light guest's commit-mode latency beside a guest reading or writing flat out, per session share", Run: runBenchFairness},
	"step":      {Summary: "a recorded training step's calls per transport, or many guests replaying it at once against a running node", Run: runBenchStep},
}

func runBenchStep(args []string) error {
	fs := cli.NewFlags("bench step", "[flags]")
	var steps, guests int
	cli.IntVar(fs, &steps, "steps", 50, 1, cli.MaxInt, "timed steps (per guest)")
	cli.IntVar(fs, &guests, "guests", 1, 1, 1024, "with --endpoint: guests replaying the step at once, each its own session")
	endpoint := fs.String("endpoint", "", "a running node's guest endpoint (unix://, tcp://, shm+unix://): the guests replay the step there (a replicated pair, GPU workers and the GPU the node serves included); none: every transport against a software GPU in this process")
	asJSON := fs.Bool("json", false, "print JSON rows instead of a table")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	var rows []bench.StepRow
	var err error
	if *endpoint != "" {
		var row bench.StepRow
		row, err = bench.StepLive(*endpoint, guests, steps)
		rows = []bench.StepRow{row}
	} else {
		rows, err = bench.Step(steps)
	}
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(os.Stdout).Encode(rows)
	}
	if *endpoint != "" {
		fmt.Printf("%d guests replaying a recorded step at %s at once: summed steps/s, a guest's µs per step and the requests it waited for per step\n", guests, *endpoint)
		fmt.Printf("%.0f steps/s, %.1f µs/step, %.2f waits/step\n", rows[0].StepsPerSec, rows[0].UsPerStep, rows[0].WaitsPerStep)
		return nil
	}
	bench.PrintStep(os.Stdout, rows)
	return nil
}

func runBenchFairness(args []string) error {
	fs := cli.NewFlags("bench fairness", "[flags]")
	var opts bench.FairnessOptions
	shares := cli.String(fs, "shares", "off,1MiB", func(v string) error { _, err := parseShares(v); return err },
		"the primary's --replicate.session-share-bytes, one pair each, side by side, comma-separated (off: no share, the log as before issue 47)")
	cli.IntVar(fs, &opts.Rounds, "rounds", 3, 1, 1000, "interleaved rounds; the percentiles pool every round's calls")
	cli.IntVar(fs, &opts.Calls, "calls", 1000, 10, cli.MaxInt, "the light guest's timed reads per load and round")
	cli.SizeVar(fs, &opts.LightBytes, "light-bytes", 4096, 1, 1<<24, "bytes per light read")
	cli.SizeVar(fs, &opts.HeavyBytes, "heavy-bytes", 16<<20, 1, 1<<30, "bytes per busy guest read or write")
	var linkRate int64
	cli.SizeVar(fs, &linkRate, "link-rate", 0, 0, cli.MaxInt64, "bytes per second the primary-to-standby link carries, with KiB, MiB or GiB (0: loopback, unlimited); a rate puts the nodes in network namespaces joined by a rate-limited veth link (needs root and iproute2), a link slower than the guests' copies, as between hosts")
	keepLogs := fs.Bool("keep-logs", false, "keep the nodes' logs (their directories are printed on stderr; they are kept anyway when a pair fails)")
	busy := cli.Choice(fs, "busy", "off", []string{"off", "reader", "writer"}, "run only a busy guest that reads or writes --heavy-bytes flat out at --busy-endpoint, until signalled (the benchmark starts it so, in a process of its own)")
	busyEndpoint := fs.String("busy-endpoint", "", "the busy guest's endpoint (with --busy)")
	var bf agent.BackendFlags
	bf.Register(fs)
	asJSON := fs.Bool("json", false, "print JSON rows instead of a table")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *busy != "off" {
		return bench.RunBusyGuest(*busyEndpoint, *busy, opts.HeavyBytes, os.Stdout)
	}
	opts.Shares, _ = parseShares(*shares)
	bin, err := os.Executable()
	if err != nil {
		return err
	}
	opts.Nodes = drill.NodesOptions{Binary: bin, Backend: bf.Name, Flags: []string{"--sim.memory-bytes", strconv.FormatUint(bf.SimMemory, 10)}, LinkRate: linkRate,
		KeepLogs: *keepLogs}
	opts.BusyGuest = func(endpoint, load string, bytes int) *exec.Cmd {
		return exec.Command(bin, "bench", "fairness", "--busy", load, "--busy-endpoint", endpoint, "--heavy-bytes", strconv.Itoa(bytes))
	}
	opts.Progress = os.Stderr
	rows, err := bench.Fairness(opts)
	if err != nil || *asJSON {
		return errors.Join(err, jsonOut(*asJSON && err == nil, rows))
	}
	link := "loopback"
	if linkRate > 0 {
		link = cli.FormatBytes(uint64(linkRate)) + "/s veth link"
	}
	fmt.Printf("a light guest's %d-byte reads (commit points) beside a guest reading or writing %d bytes per call flat out; primary and standby processes on %s over %s, commit mode\n",
		opts.LightBytes, opts.HeavyBytes, bf.Name, link)
	bench.PrintFairness(os.Stdout, rows)
	return nil
}

func runBench(args []string) error {
	names := strings.Join(slices.Sorted(maps.Keys(benchmarks)), ", ")
	if len(args) == 0 {
		return cli.Usage(fmt.Errorf("usage: %s bench BENCHMARK [flags] (benchmarks: %s)", cli.Name(), names))
	}
	switch args[0] {
	case "-h", "--help", "-help":
		fmt.Printf("Usage: %[1]s bench BENCHMARK [flags]\n\nBenchmarks: %[2]s.\nRun '%[1]s bench BENCHMARK --help' for its flags.\n", cli.Name(), names)
		return flag.ErrHelp
	}
	b, ok := benchmarks[args[0]]
	if !ok {
		hint := ""
		if s := cli.Closest(args[0], slices.Sorted(maps.Keys(benchmarks))); s != "" {
			hint = fmt.Sprintf("did you mean %s? ", s)
		}
		return cli.Usage(fmt.Errorf("unknown benchmark %q (%shave: %s)", args[0], hint, names))
	}
	return b.Run(args[1:])
}

// parseShares reads bench fairness's --shares: sizes, or off (0).
func parseShares(v string) ([]int64, error) {
	var out []int64
	for _, f := range strings.Split(v, ",") {
		if f == "off" {
			out = append(out, 0)
			continue
		}
		n, err := cli.ParseSizeList(f)
		if err != nil {
			return nil, err
		}
		out = append(out, int64(n[0]))
	}
	return out, nil
}

func runBenchResync(args []string) error {
	fs := cli.NewFlags("bench resync", "[flags]")
	var opts bench.ResyncOptions
	sizes := resyncOptionFlags(fs, &opts)
	var bf agent.BackendFlags
	bf.Register(fs)
	asJSON := fs.Bool("json", false, "print JSON rows instead of a table")
	standbyBackend := standbyBackendFlag(fs, &bf)
	logNodes := fs.Bool("log-nodes", false, "write both nodes' logs to stderr (the resync's progress, once a second); with --processes, keep their log files and say where")
	processes := fs.Bool("processes", false, "run the primary and the standby as processes of their own, as a deployment does, "+
		"instead of inside the benchmark's (whose address space, cores and garbage collector they would share with the guests); "+
		"their logs are kept (and named) when a standby never protects its primary, when verify finds them different, or with --log-nodes")
	profile := profileFlag(fs)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if err := resyncPlacement(&opts, fs, &bf, *processes, *logNodes); err != nil {
		return err
	}
	stop, err := profile()
	if err != nil {
		return err
	}
	defer stop()
	opts.Sizes, _ = cli.ParseSizeList(*sizes) // checked when set
	opts.Progress, opts.NewBackend, opts.NewStandbyBackend = os.Stderr, bf.Open, standbyBackend()
	rows, err := bench.Resync(opts)
	if err != nil || *asJSON {
		return errors.Join(err, jsonOut(*asJSON && err == nil, rows))
	}
	fmt.Printf("a standby joins while %d guests run a mixed workload (copies, memsets, DtoD, pointer_chase) on loopback; commit mode\n", opts.Guests)
	bench.PrintResync(os.Stdout, rows)
	return nil
}

// resyncOptionFlags registers the resync's own options; the returned
// string is --sizes.
func resyncOptionFlags(fs *flag.FlagSet, opts *bench.ResyncOptions) *string {
	sizes := cli.String(fs, "sizes", "256MiB,1GiB,4GiB", func(v string) error { _, err := cli.ParseSizeList(v); return err },
		"guest memory per row (all guests together), comma-separated, with KiB, MiB or GiB")
	cli.IntVar(fs, &opts.Guests, "guests", 2, 1, 1024, "guests running the mixed workload")
	cli.DurationVar(fs, &opts.Baseline, "baseline", time.Second, time.Millisecond, time.Hour, "how long guests run before the standby joins (their throughput before)")
	cli.SizeVar(fs, &opts.Rate, "rate", 0, 0, cli.MaxInt64, "bound on the resync stream in bytes per second (0: none)")
	cli.SizeVar(fs, &opts.Budget, "resync-budget", 0, 0, cli.MaxInt64, "the primary's resync budget (--replicate.resync-budget-bytes), with KiB, MiB or GiB (0: the primary's default)")
	cli.FractionVar(fs, &opts.GuestShare, "guest-share", 0, 0, 1, "the primary's --replicate.resync-guest-share: the most of the link guests' writes take while the standby joins (0: the primary's default rule)")
	fs.BoolVar(&opts.StopTheWorld, "stop-the-world", false, "also resync each size the old way (every guest stopped while all memory is copied), for comparison")
	fs.BoolVar(&opts.IdleGuests, "idle-guests", false, "also resync each size with the guests making no calls while the standby joins (the snapshot stream alone), for comparison")
	return sizes
}

// resyncPlacement puts the nodes in processes of their own (from this
// binary) with --processes, and their logs on stderr with --log-nodes.
func resyncPlacement(opts *bench.ResyncOptions, fs *flag.FlagSet, bf *agent.BackendFlags, processes, logNodes bool) error {
	if processes {
		bin, err := os.Executable()
		if err != nil {
			return err
		}
		opts.Processes = &drill.NodesOptions{Binary: bin, Backend: bf.Name, StandbyBackend: fs.Lookup("standby-backend").Value.String(),
			Flags: []string{"--sim.memory-bytes", strconv.FormatUint(bf.SimMemory, 10)}, KeepLogs: logNodes}
	}
	if logNodes {
		opts.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return nil
}

// jsonOut writes v as one JSON line when on.
func jsonOut(on bool, v any) error {
	if !on {
		return nil
	}
	return json.NewEncoder(os.Stdout).Encode(v)
}

// standbyBackendFlag adds --standby-backend; the returned function gives
// the standby's backend opener once the flags are parsed (nil: the same as
// --backend's).
func standbyBackendFlag(fs *flag.FlagSet, bf *agent.BackendFlags) func() func() (gpu.Backend, error) {
	name := fs.String("standby-backend", "", "the standby's GPU backend when not --backend's: cuda:N (another device) or sim; "+
		"on one GPU the standby's replay time-slices with the primary, and in one process it gets other addresses, so kernels that follow stored pointers cannot run there")
	return func() func() (gpu.Backend, error) {
		if *name == "" {
			return nil
		}
		sb := *bf
		sb.Name = *name
		return sb.Open
	}
}

// profileFlag adds --cpuprofile and --trace; the returned function starts
// what was asked for once the flags are parsed, and returns its stop.
func profileFlag(fs *flag.FlagSet) func() (func(), error) {
	cpu := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file (go tool pprof FILE)")
	exec := fs.String("trace", "", "write a runtime execution trace of the whole run to this file (go tool trace FILE; -pprof=sync or sched for where goroutines waited)")
	return func() (func(), error) {
		var stops []func()
		stop := func() {
			for _, s := range stops {
				s()
			}
		}
		for _, p := range []struct {
			path         string
			start        func(io.Writer) error
			stopRecorder func()
		}{{*cpu, pprof.StartCPUProfile, pprof.StopCPUProfile}, {*exec, trace.Start, trace.Stop}} {
			if p.path == "" {
				continue
			}
			f, err := os.Create(p.path)
			if err == nil {
				if err = p.start(f); err != nil {
					f.Close()
				}
			}
			if err != nil {
				stop()
				return nil, err
			}
			stops = append(stops, func() { p.stopRecorder(); f.Close() })
		}
		return stop, nil
	}
}

func runBenchPV(args []string) error {
	fs := cli.NewFlags("bench pv", "[flags]")
	var opts bench.PVOptions
	cli.IntVar(fs, &opts.Rounds, "rounds", 7, 1, 1000, "interleaved rounds; the report gives each configuration's median")
	cli.IntVar(fs, &opts.Batch, "batch", 2000, 1, cli.MaxInt, "operations per timed batch (bulk copies: batch/250)")
	cli.SizeVar(fs, &opts.BulkBytes, "bulk-bytes", 16<<20, 1, 1<<34, "bytes per bulk host-to-device copy")
	fs.StringVar(&opts.Endpoint, "endpoint", "", "measure running nodes at these guest endpoints (unix://, tcp://, vsock://, shm+unix://; comma-separated, each optionally NAME=URL to label its rows) from this process, beside --backend in-process")
	var bf agent.BackendFlags
	bf.Register(fs)
	asJSON := fs.Bool("json", false, "print JSON rows instead of a table")
	profile := profileFlag(fs)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	stop, err := profile()
	if err != nil {
		return err
	}
	defer stop()
	opts.Progress = os.Stderr
	opts.NewBackend = bf.Open
	rows, err := bench.PV(opts)
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(os.Stdout).Encode(rows)
	}
	if opts.Endpoint != "" {
		fmt.Printf("a live node at %s, called from this process, vs the %s backend called in-process (medians of interleaved rounds)\n", opts.Endpoint, bf.Name)
	} else {
		fmt.Println("paravirtual call cost over unix, tcp and shared memory (shm+unix) vs the same backend called in-process (medians of interleaved rounds)")
	}
	bench.PrintPV(os.Stdout, rows)
	return nil
}

func runBenchReplicate(args []string) error {
	fs := cli.NewFlags("bench replicate", "[flags]")
	var opts bench.ReplicateOptions
	cli.SizeVar(fs, &opts.BulkBytes, "bulk-bytes", 256<<20, 1, 1<<34, "bytes per bulk copy timing")
	cli.IntVar(fs, &opts.Rounds, "rounds", 5, 1, 1000, "interleaved rounds; the report gives medians")
	cli.IntVar(fs, &opts.Calls, "calls", 1000, 1, cli.MaxInt, "small calls per latency timing")
	var bf agent.BackendFlags
	bf.Register(fs)
	endpoint := fs.String("endpoint", "", "measure running primaries (each with its standby, in the mode it runs) at these guest endpoints (comma-separated, each optionally NAME=URL, e.g. unreplicated=shm+unix:///a.sock,commit=shm+unix:///b.sock) from this process, beside --backend in-process and the raw TCP link")
	standbyBackend := standbyBackendFlag(fs, &bf)
	asJSON := fs.Bool("json", false, "print JSON instead of tables")
	profile := profileFlag(fs)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	stop, err := profile()
	if err != nil {
		return err
	}
	defer stop()
	opts.Progress, opts.NewBackend, opts.NewStandbyBackend = os.Stderr, bf.Open, standbyBackend()
	rep, err := replicateRun(*endpoint)(opts)
	if err != nil || *asJSON {
		return errors.Join(err, jsonOut(*asJSON && err == nil, rep))
	}
	title := "replication on loopback (primary, standby and guest in one process; medians of interleaved rounds)"
	if *endpoint != "" {
		title = fmt.Sprintf("a live primary at %s (replicating as it was started), called from this process, vs the %s backend in-process (medians of interleaved rounds)", *endpoint, bf.Name)
	}
	fmt.Println(title)
	bench.PrintReplicate(os.Stdout, rep)
	return nil
}

// replicateRun is the replication benchmark in process, or against the
// running primaries at endpoint.
func replicateRun(endpoint string) func(bench.ReplicateOptions) (bench.ReplicateReport, error) {
	if endpoint == "" {
		return bench.Replicate
	}
	return func(o bench.ReplicateOptions) (bench.ReplicateReport, error) { return bench.ReplicateLive(o, endpoint) }
}

func runBenchApply(args []string) error {
	fs := cli.NewFlags("bench apply", "[flags]")
	chunk := cli.Size(fs, "chunk-bytes", 16<<20, 1, 1<<30, "bytes per record (pvdriver splits copies at 16 MiB)")
	total := cli.Size(fs, "total-bytes", 1<<30, 1, 1<<40, "bytes per timing")
	rounds := cli.Int(fs, "rounds", 5, 1, 1000, "interleaved rounds; the report gives medians")
	var bf agent.BackendFlags
	bf.Register(fs)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	rows, err := bench.Apply(bf.Open, *chunk, *total, *rounds, os.Stderr)
	if err != nil {
		return err
	}
	fmt.Println("standby apply throughput vs a plain copy on the same backend (medians of interleaved rounds)")
	bench.PrintApply(os.Stdout, rows)
	return nil
}

// mmioFlags are bench mmio's flags beyond the options they set.
type mmioFlags struct {
	long, pin, asJSON          *bool
	rounds, perThread          *int
	plotPath, workloads, modes *string
}

func (m *mmioFlags) register(fs *flag.FlagSet, opts *bench.MMIOOptions) {
	m.long = fs.Bool("long", false, "more writes and rounds, for careful figures (several minutes)")
	m.rounds = cli.Int(fs, "rounds", 0, 0, 1000, "interleaved rounds (default 3, or 7 with --long)")
	m.pin = fs.Bool("pin", true, "pin the tracer and the guest's threads to one CPU (insn and auto mode; see the mmiotrace package doc)")
	m.plotPath = fs.String("plot", "", "also draw ns per write by mode and workload to this file (.png or .svg)")
	m.asJSON = fs.Bool("json", false, "print the cells as JSON instead of a table")
	m.workloads = fs.String("workloads", strings.Join(opts.Workloads, ","), "mmio-guest workloads, each NAME or NAME:PAGES (aperture pages; default 1024)")
	m.modes = fs.String("modes", strings.Join(opts.Modes, ","), "modes, side by side in each round: "+strings.Join(bench.MMIOModes, ", "))
	cli.IntVar(fs, &opts.Threads, "threads", opts.Threads, 1, 1024, "OS threads storing at once in the threads workload")
	m.perThread = cli.Int(fs, "thread-stores", opts.Writes["threads"]/opts.Threads, 1, 1<<30, "stores per thread in the threads workload")
	cli.IntVar(fs, &opts.InsnWrites, "insn-writes", opts.InsnWrites, 0, cli.MaxInt, "at most this many stores per run in the insn modes and kmod, where each store faults (0: no cap)")
}

// apply sets the options the flags say, once parsed.
func (m *mmioFlags) apply(opts *bench.MMIOOptions) error {
	if *m.long {
		fresh := bench.DefaultMMIOOptions(opts.Guest, true)
		opts.Rounds, opts.Writes = fresh.Rounds, fresh.Writes
	}
	opts.Writes["threads"] = *m.perThread * opts.Threads
	opts.Pin = *m.pin
	opts.Workloads, opts.Modes = strings.Split(*m.workloads, ","), strings.Split(*m.modes, ",")
	for _, mode := range opts.Modes {
		if !slices.Contains(bench.MMIOModes, mode) {
			return fmt.Errorf("unknown mode %q (have: %s)", mode, strings.Join(bench.MMIOModes, ", "))
		}
	}
	if *m.rounds > 0 {
		opts.Rounds = *m.rounds
	}
	opts.Progress, opts.Terminal = os.Stderr, agent.IsTerminal(os.Stderr)
	return nil
}

func runBenchMMIO(args []string) error {
	fs := cli.NewFlags("bench mmio", "[flags]")
	self, err := os.Executable()
	if err != nil {
		return err
	}
	opts := bench.DefaultMMIOOptions([]string{self, "mmio-guest"}, false)
	var m mmioFlags
	m.register(fs, &opts)
	profile := profileFlag(fs)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if err := m.apply(&opts); err != nil {
		return err
	}
	stop, err := profile()
	if err != nil {
		return err
	}
	cells, err := bench.MMIO(opts)
	stop()
	if err != nil {
		return err
	}
	if *m.plotPath != "" {
		if err := bench.PlotMMIO(*m.plotPath, cells); err != nil {
			return err
		}
	}
	if *m.asJSON {
		return json.NewEncoder(os.Stdout).Encode(cells)
	}
	printMMIOCells(opts, cells)
	return nil
}

// printMMIOCells prints the cells as a table under a line saying how they
// were measured.
func printMMIOCells(opts bench.MMIOOptions, cells []bench.MMIOCell) {
	pinned := "insn and auto mode's tracer and guest threads pinned to one CPU"
	if !opts.Pin {
		pinned = "not pinned"
	}
	fmt.Printf("MMIO tracing cost (software GPU; each cell a fresh guest process; medians of %d interleaved rounds; %s; %d CPUs)\n", opts.Rounds, pinned, runtime.NumCPU())
	bench.PrintMMIO(os.Stdout, cells)
}
