package labcmd

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/vgpuha/vgpuha/internal/agent"
	"github.com/vgpuha/vgpuha/internal/cli"
	"github.com/vgpuha/vgpuha/internal/lab/drill"
)

// drillFlags are drill's flags; options turns them into the drill's
// options once parsed.
type drillFlags struct {
	iterations                                       *int
	faults, topology, mode, transport, backend, plot *string
	detector                                         *string
	coord, sideBySide, asJSON                        *bool
	ttl                                              *time.Duration
	seed                                             *uint64
	stateBytes                                       uint64
}

func (d *drillFlags) register(fs *flag.FlagSet) {
	d.iterations = cli.Int(fs, "iterations", 3, 1, 1<<20, "iterations")
	d.faults = fs.String("faults", "", "faults to cycle through: "+drill.FaultHelp()+"; default: all that the topology allows")
	d.topology = fs.String("topology", "auto", "netns (each node in its own network namespace, veth between), loopback, or auto (netns where it can be made)")
	d.mode = cli.Choice(fs, "mode", "commit", []string{"sync", "commit", "epoch"}, "replication mode: sync or commit (no loss), or epoch (a simulated VM checkpointer; the kill fault only)")
	d.coord = fs.Bool("coordinator", false, "decide roles in etcd: the drill starts a 3-member etcd cluster, a primary, a standby and a pool standby, all on loopback")
	d.ttl = cli.Duration(fs, "coordinator.ttl", 2*time.Second, time.Second, time.Hour, "with --coordinator: every node's lease (whole seconds); a primary unrenewed for half of it stops serving")
	d.sideBySide = fs.Bool("side-by-side", false, "with --coordinator: run each iteration again by two nodes alone, where they can drill its fault")
	d.seed = cli.Int[uint64](fs, "seed", 1, 0, cli.MaxUint64, "seed for the moments faults strike")
	d.transport = fs.String("transport", drill.TransportUnix, "the guest's transport: unix (through a proxy the guest-cut fault cuts) or shm (shared-memory rings with the node, shm+unix; Linux)")
	d.backend = cli.String(fs, "backend", "auto", agent.CheckBackend, "GPU backend of both nodes")
	d.detector = cli.Choice(fs, "failover.detector", "fixed", []string{"fixed", "phi"}, "the standbys' failure detector")
	d.asJSON = fs.Bool("json", false, "print one JSON object")
	d.plot = fs.String("plot", "", "write an SVG timeline of the iterations to this file")
	cli.SizeVar(fs, &d.stateBytes, "state-bytes", 0, 0, cli.MaxUint64, "the drill's guest also holds this much device memory (e.g. 256MiB, 16GiB; whole MiB), filled with a pattern and read back after each iteration; "+
		"two nodes: the standby joins once it is filled and is resynced before the faults")
}

// options are the drill's options, checked; the agents run from this
// binary.
func (d *drillFlags) options() (drill.Options, error) {
	netns, err := drillTopology(*d.topology)
	if err != nil {
		return drill.Options{}, err
	}
	bin, err := os.Executable()
	if err != nil {
		return drill.Options{}, err
	}
	o := drill.Options{Binary: bin, Backend: *d.backend, Mode: *d.mode, Netns: netns, Iterations: *d.iterations, Seed: *d.seed,
		Coordinator: *d.coord, CoordinatorTTL: *d.ttl, Detector: *d.detector, SideBySide: *d.sideBySide, StateBytes: d.stateBytes, Transport: *d.transport,
		Note: func(s string) { fmt.Fprintln(os.Stderr, s) },
		Progress: func(r drill.Record, n int) {
			fmt.Fprintf(os.Stderr, "iteration %d/%d (%s): %s at launch %d: passed=%v %s\n", r.Iteration, n, setupName(r.Coordinated), r.Fault, r.AtLaunch, r.Passed, r.Problem)
		}}
	if *d.faults != "" {
		o.Faults = strings.Split(*d.faults, ",")
	}
	return o, o.Validate()
}

func runDrill(args []string) error {
	fs := cli.NewFlags("drill", "[flags]")
	var d drillFlags
	d.register(fs)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	o, err := d.options()
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "topology: %s\n", o.Topology())
	// SIGTERM or SIGINT end the drill cleanly: the iteration under way
	// tears down its agents, namespaces and directory.
	ctx, stopSignals := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stopSignals()
	o.Stop = ctx.Done()
	rep, err := drill.Run(o)
	if errors.Is(err, drill.ErrInterrupted) {
		printDrill(os.Stdout, rep)
		return fmt.Errorf("interrupted after %d of %d iterations; every agent, namespace and directory it made is gone", rep.Iterations, o.Iterations)
	}
	if err != nil {
		return err
	}
	return d.report(rep)
}

// report writes the plot, prints the report and fails on a failed
// iteration.
func (d *drillFlags) report(rep drill.Report) error {
	if *d.plot != "" {
		if err := writeDrillPlot(*d.plot, rep); err != nil {
			return err
		}
	}
	if *d.asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		enc.Encode(rep)
	} else {
		printDrill(os.Stdout, rep)
	}
	if rep.Failed > 0 {
		return fmt.Errorf("%d of %d iterations failed", rep.Failed, rep.Iterations)
	}
	return nil
}

// drillTopology resolves --topology to whether the pair runs in network
// namespaces.
func drillTopology(name string) (bool, error) {
	switch name {
	case "auto":
		return drill.NetnsAvailable(), nil
	case "loopback":
		return false, nil
	case "netns":
		if !drill.NetnsAvailable() {
			return false, errors.New("--topology netns: network namespaces cannot be made here (needs root and iproute2)")
		}
		return true, nil
	}
	return false, fmt.Errorf("unknown topology %q (valid: auto, netns, loopback)", name)
}

func writeDrillPlot(path string, rep drill.Report) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := rep.WriteSVG(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func printDrill(w io.Writer, rep drill.Report) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	h := func(t drill.Term) string { return t.Header() }
	fmt.Fprintf(tw, "ITER\tSETUP\tFAULT\tAT LAUNCH\tPASSED\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\tOLD PRIMARY FENCED\tROLLED BACK\n",
		h(drill.TermSilence), h(drill.TermDetection), h(drill.TermPromotion), h(drill.TermTakeover), h(drill.TermGuestPause),
		h(drill.TermGuestReconnect), h(drill.TermLost), h(drill.TermBothServing))
	for _, r := range rep.Records {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%v\t%.0f\t%.0f\t%.1f\t%.1f\t%.1f\t%s\t%d\t%s\t%v\t%v\n", r.Iteration, setupName(r.Coordinated), r.Fault, r.AtLaunch, r.Passed,
			r.SilenceMS, r.DetectionMS, r.PromotionMS, r.TakeoverMS, r.PauseMS, r.GuestReconnect(), r.LostRequests, bothServing(r), r.Fenced, r.RolledBack)
	}
	tw.Flush()
	fmt.Fprintf(w, "\n%s, mode %s: %d/%d passed, %d requests lost or repeated\n", rep.Topology, rep.Mode, rep.Passed, rep.Iterations, rep.LostRequests)
	fmt.Fprintf(w, "unplanned takeovers (kill, freeze): %s ms p50 %.0f p99 %.0f max %.0f; %s ms p50 %.0f p99 %.0f max %.0f; %s ms p50 %.0f p99 %.0f max %.0f\n",
		drill.TermDetection, rep.DetectionMS.P50, rep.DetectionMS.P99, rep.DetectionMS.Max, drill.TermTakeover, rep.TakeoverMS.P50, rep.TakeoverMS.P99, rep.TakeoverMS.Max,
		drill.TermGuestPause, rep.PauseMS.P50, rep.PauseMS.P99, rep.PauseMS.Max)
	if rep.StateBytes > 0 {
		fmt.Fprintf(w, "state: the guest held %d MiB; %d MiB read back equal over %d iterations (%d MiB each)\n",
			rep.StateBytes>>20, rep.BytesVerified>>20, rep.Iterations, rep.StateBytes>>20)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(tw, "FAULT\tSETUP\tPASSED\tPROMOTIONS\t%s p50/p99\t%s p50/p99\t%s p50/p99\t%s\t%s p50/max\n",
		h(drill.TermDetection), h(drill.TermTakeover), h(drill.TermGuestPause), h(drill.TermLost), h(drill.TermBothServing))
	for _, f := range rep.Faults {
		fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%d/%d\t%.0f/%.0f\t%.0f/%.0f\t%.0f/%.0f\t%d\t%.1f/%.1f\n", f.Fault, setupName(f.Coordinated), f.Passed, f.Iterations,
			f.Promotions, f.Iterations, f.DetectionMS.P50, f.DetectionMS.P99, f.TakeoverMS.P50, f.TakeoverMS.P99, f.PauseMS.P50, f.PauseMS.P99,
			f.LostRequests, f.BothServingMS.P50, f.BothServingMS.Max)
	}
	tw.Flush()
	fmt.Fprintln(w, "\nterms (the demo's too):")
	drill.Legend(w, drill.TermSilence, drill.TermDetection, drill.TermPromotion, drill.TermTakeover, drill.TermGuestPause,
		drill.TermGuestReconnect, drill.TermLost, drill.TermBothServing)
}

// bothServing is the both-serving window: its length, and from when
// after the fault.
func bothServing(r drill.Record) string {
	if r.BothServingMS == 0 {
		return "0"
	}
	return fmt.Sprintf("%.1f (from +%.1f)", r.BothServingMS, r.BothServingFromMS)
}

func setupName(coordinated bool) string {
	if coordinated {
		return "etcd"
	}
	return "two nodes"
}
