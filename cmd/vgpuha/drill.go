package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/vgpuha/vgpuha/internal/faultnet"
	"github.com/vgpuha/vgpuha/internal/kernels"
	"github.com/vgpuha/vgpuha/pvdriver"
)

// drillRecord is one drill iteration.
type drillRecord struct {
	Iteration    int     `json:"iteration"`
	Fault        string  `json:"fault"`
	AtLaunch     int     `json:"at_launch"`
	Passed       bool    `json:"passed"`
	Failovers    int     `json:"failovers"`
	DetectionMS  float64 `json:"detection_ms,omitempty"`
	PromotionMS  float64 `json:"promotion_ms,omitempty"`
	PauseMS      float64 `json:"pause_ms,omitempty"`
	LostRequests int64   `json:"lost_requests"` // negative: applied twice
	Fenced       bool    `json:"old_primary_fenced,omitempty"`
	// RolledBack: the guest was told its session was rolled back (a
	// partition: the old primary served on, unprotected, and was fenced).
	RolledBack bool   `json:"rolled_back,omitempty"`
	Problem    string `json:"problem,omitempty"`
}

type quantiles struct {
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

type drillReport struct {
	Topology     string        `json:"topology"`
	Mode         string        `json:"mode"`
	Iterations   int           `json:"iterations"`
	Passed       int           `json:"passed"`
	Failed       int           `json:"failed"`
	LostRequests int64         `json:"lost_requests"`
	DetectionMS  quantiles     `json:"detection_ms"` // kill and freeze iterations
	PauseMS      quantiles     `json:"pause_ms"`     // kill and freeze iterations
	Records      []drillRecord `json:"records"`
}

func runDrill(args []string) error {
	fs := newFlags("drill", "[flags]")
	iterations := fs.Int("iterations", 3, "iterations")
	faults := fs.String("faults", "", "faults to cycle through: kill (SIGKILL primary), freeze (SIGSTOP primary, SIGCONT after the takeover), standby-kill, switchover (planned), guest-cut (drop the guest's connections to the primary), partition (cut the primary-standby link, heal it after the takeover; needs namespaces); default: all that the topology allows")
	topology := fs.String("topology", "auto", "netns (each node in its own network namespace, veth between), loopback, or auto (netns where it can be made)")
	mode := fs.String("mode", "commit", "replication mode: sync or commit (no loss), or epoch (a simulated VM checkpointer; the kill fault only)")
	seed := fs.Uint64("seed", 1, "seed for the moments faults strike")
	backendName := fs.String("backend", "auto", "GPU backend of both nodes")
	asJSON := fs.Bool("json", false, "print one JSON object")
	plot := fs.String("plot", "", "write an SVG timeline of the iterations to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	netns := *topology == "netns" || *topology == "auto" && netnsAvailable()
	rep := drillReport{Mode: *mode, Topology: "processes on loopback (no network namespaces here: link partitions are not drilled)"}
	if netns {
		rep.Topology = "primary and standby in their own network namespaces, veth between"
	}
	if *faults == "" && *mode == "epoch" {
		*faults = "kill"
	}
	if *faults == "" {
		*faults = "kill,freeze,standby-kill,switchover,guest-cut"
		if netns {
			*faults += ",partition"
		}
	}
	kinds := strings.Split(*faults, ",")
	rng := rand.New(rand.NewPCG(*seed, *seed^0x9e3779b97f4a7c15))
	fmt.Fprintf(os.Stderr, "topology: %s\n", rep.Topology)
	for i := 0; i < *iterations; i++ {
		fault := kinds[i%len(kinds)]
		at := 60 + rng.IntN(280)
		rec := drillOnce(*backendName, *mode, fault, at, netns)
		rec.Iteration = i + 1
		rep.Records = append(rep.Records, rec)
		fmt.Fprintf(os.Stderr, "iteration %d/%d: %s at launch %d: passed=%v %s\n", i+1, *iterations, fault, at, rec.Passed, rec.Problem)
	}
	var det, pause []float64
	for _, r := range rep.Records {
		rep.Iterations++
		if r.Passed {
			rep.Passed++
		} else {
			rep.Failed++
		}
		rep.LostRequests += max(r.LostRequests, -r.LostRequests)
		// The quantiles describe unplanned takeovers; a switchover or a
		// guest's own blip has nothing to detect and pauses far less.
		if r.Failovers > 0 && (r.Fault == "kill" || r.Fault == "freeze") {
			pause = append(pause, r.PauseMS)
			det = append(det, r.DetectionMS)
		}
	}
	rep.DetectionMS, rep.PauseMS = quantilesOf(det), quantilesOf(pause)
	if *plot != "" {
		if err := writeDrillSVG(*plot, rep); err != nil {
			return err
		}
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		enc.Encode(rep)
	} else {
		tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ITER\tFAULT\tAT LAUNCH\tPASSED\tDETECTION ms\tPROMOTION ms\tGUEST PAUSE ms\tLOST\tOLD PRIMARY FENCED\tROLLED BACK")
		for _, r := range rep.Records {
			fmt.Fprintf(tw, "%d\t%s\t%d\t%v\t%.0f\t%.1f\t%.1f\t%d\t%v\t%v\n", r.Iteration, r.Fault, r.AtLaunch, r.Passed, r.DetectionMS, r.PromotionMS, r.PauseMS, r.LostRequests, r.Fenced, r.RolledBack)
		}
		tw.Flush()
		fmt.Printf("\n%s, mode %s: %d/%d passed, %d requests lost or repeated\n", rep.Topology, rep.Mode, rep.Passed, rep.Iterations, rep.LostRequests)
		fmt.Printf("detection ms p50 %.0f p99 %.0f max %.0f; guest pause ms p50 %.0f p99 %.0f max %.0f\n",
			rep.DetectionMS.P50, rep.DetectionMS.P99, rep.DetectionMS.Max, rep.PauseMS.P50, rep.PauseMS.P99, rep.PauseMS.Max)
	}
	if rep.Failed > 0 {
		return fmt.Errorf("%d of %d iterations failed", rep.Failed, rep.Iterations)
	}
	return nil
}

func quantilesOf(v []float64) quantiles {
	if len(v) == 0 {
		return quantiles{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	at := func(q float64) float64 { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return quantiles{P50: at(0.5), P99: at(0.99), Max: s[len(s)-1]}
}

// drillOnce runs a counter workload (every launch adds into counters, so a
// lost or repeated launch shows exactly) on a fresh primary/standby pair
// and injects fault at launch number at.
func drillOnce(backend, mode, fault string, at int, netns bool) drillRecord {
	rec := drillRecord{Fault: fault, AtLaunch: at}
	fail := func(format string, a ...any) drillRecord {
		rec.Problem = fmt.Sprintf(format, a...)
		return rec
	}
	if fault == "partition" && !netns {
		return fail("partition needs network namespaces")
	}
	p, err := startPair(backend, mode, netns)
	if err != nil {
		return fail("%v", err)
	}
	defer p.stop()
	// The guest reaches the primary through a proxy, so that its own link
	// can be cut (the guest-cut fault).
	px, err := faultnet.Listen("unix://"+filepath.Join(p.dir, "guest-proxy.sock"), p.primaryEP)
	if err != nil {
		return fail("%v", err)
	}
	defer px.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	g, err := pvdriver.Open(ctx, "unix://"+filepath.Join(p.dir, "guest-proxy.sock"), pvdriver.Options{GuestName: "drill", Failover: []string{p.standbyEP}})
	cancel()
	if err != nil {
		return fail("%v", err)
	}
	defer g.Close()
	img, _ := kernels.Image("histogram")
	m, err := g.LoadModule(img)
	if err != nil {
		return fail("%v", err)
	}
	f, err := g.GetFunction(m, "histogram")
	if err != nil {
		return fail("%v", err)
	}
	const n, nbins, launches = 1024, 16, 400
	data := make([]byte, 4*n)
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint32(data[4*i:], uint32(i))
	}
	dd, err := g.Alloc(4 * n)
	if err != nil {
		return fail("%v", err)
	}
	bins, err := g.Alloc(4 * nbins)
	if err != nil {
		return fail("%v", err)
	}
	if err := g.CopyHtoD(dd, data); err != nil {
		return fail("%v", err)
	}
	if err := g.Memset8(bins, 0, 4*nbins); err != nil {
		return fail("%v", err)
	}
	cfg := pvdriver.LaunchConfig{Grid: pvdriver.Dim(n / 256), Block: pvdriver.Dim(256)}
	if mode == "epoch" {
		return drillEpoch(g, p, f, cfg, dd, bins, at, rec)
	}
	var struck time.Time
	for i := 0; i < launches; i++ {
		if i == at {
			struck = time.Now()
			switch fault {
			case "kill":
				p.primary.Process.Kill()
			case "freeze":
				p.primary.Process.Signal(syscall.SIGSTOP)
			case "standby-kill":
				p.standby.Process.Kill()
			case "guest-cut":
				px.Cut()
			case "partition":
				if err := p.link(false); err != nil {
					return fail("cutting the link: %v", err)
				}
				go func() { // heal once the standby has taken over
					var sst struct{ Promotion *struct{} }
					waitFor(5*time.Second, func() bool { return getJSON(p.standbyAdmin, &sst) == nil && sst.Promotion != nil })
					time.Sleep(100 * time.Millisecond)
					p.link(true)
				}()
			case "switchover":
				go postAdmin(p.primaryAdmin, "/switchover", 30*time.Second)
			default:
				return fail("unknown fault %q", fault)
			}
		}
		err := g.Launch(f, cfg, pvdriver.Ptr(dd), pvdriver.U32(n), pvdriver.Ptr(bins), pvdriver.U32(nbins))
		if err == nil && i%20 == 19 {
			err = g.Synchronize()
		}
		if err == nil && i == launches-1 {
			err = g.Synchronize()
		}
		if errors.Is(err, pvdriver.ErrRolledBack) && fault == "partition" {
			// The two-node outcome: told explicitly, nothing lost silently.
			rec.RolledBack, rec.Passed = true, true
			rec.Failovers = len(g.Failovers())
			return rec
		}
		if err != nil {
			return fail("launch %d: %v", i, err)
		}
	}
	total, err := countLaunches(g, bins, n, nbins)
	if err != nil {
		return fail("reading counters: %v", err)
	}
	rec.LostRequests = launches - total
	rec.Failovers, rec.PauseMS = firstPause(g)
	var sst struct {
		Promotion *struct {
			DetectionMS float64 `json:"detection_ms"`
			Serving     time.Time
		}
	}
	if fault != "standby-kill" && fault != "partition" && fault != "guest-cut" {
		if waitFor(5*time.Second, func() bool { return getJSON(p.standbyAdmin, &sst) == nil && sst.Promotion != nil }) != nil {
			return fail("standby was not promoted")
		}
		rec.DetectionMS = sst.Promotion.DetectionMS
		rec.PromotionMS = float64(sst.Promotion.Serving.Sub(struck).Microseconds()) / 1000
	}
	if fault == "partition" {
		// The two-node case: the standby took over while the old primary,
		// cut off, served the guest on unprotected. Once the link heals
		// the old primary must learn the newer term and stop; the guest
		// then moves to the new primary and must be told that what it did
		// during the partition is not there (never lose it silently).
		var pst struct {
			Primary bool `json:"is_primary"`
		}
		rec.Fenced = waitFor(10*time.Second, func() bool { return getJSON(p.primaryAdmin, &pst) == nil && !pst.Primary }) == nil
		if !rec.Fenced {
			return fail("the old primary was not fenced after the partition healed")
		}
		err := g.Synchronize()
		rec.RolledBack = errors.Is(err, pvdriver.ErrRolledBack)
		if err != nil && !rec.RolledBack {
			return fail("after the partition: %v", err)
		}
		if !rec.RolledBack {
			// Commit mode held the guest's replies while the standby was
			// unreachable, so it had forgotten nothing: its kept requests
			// went to the new primary, which must now hold every launch.
			total, err := countLaunches(g, bins, n, nbins)
			if err != nil {
				return fail("reading counters on the new primary: %v", err)
			}
			if rec.LostRequests = launches - total; rec.LostRequests != 0 {
				return fail("moved to the new primary without a rollback notice, but %d launches are missing there", rec.LostRequests)
			}
		}
		rec.Failovers = len(g.Failovers())
		rec.Passed = true
		return rec
	}
	if fault == "switchover" {
		var pst struct {
			Primary bool `json:"is_primary"`
		}
		rec.Fenced = getJSON(p.primaryAdmin, &pst) == nil && !pst.Primary
		if !rec.Fenced {
			return fail("old primary still serving after the switchover")
		}
	}
	if fault == "freeze" {
		p.primary.Process.Signal(syscall.SIGCONT)
		var pst struct {
			Primary bool `json:"is_primary"`
		}
		rec.Fenced = waitFor(5*time.Second, func() bool { return getJSON(p.primaryAdmin, &pst) == nil && !pst.Primary }) == nil
		if !rec.Fenced {
			return fail("thawed primary was not fenced")
		}
	}
	wantFailovers := 1
	if fault == "standby-kill" {
		wantFailovers = 0
	}
	if fault == "guest-cut" { // the guest resumes on the same primary; nobody takes over
		var sst struct{ Promotion *struct{} }
		if getJSON(p.standbyAdmin, &sst) == nil && sst.Promotion != nil {
			return fail("the standby took over after a guest-side link cut")
		}
	}
	switch {
	case rec.LostRequests != 0:
		return fail("counters off by %d launches", rec.LostRequests)
	case rec.Failovers != wantFailovers:
		return fail("%d failovers, want %d", rec.Failovers, wantFailovers)
	}
	rec.Passed = true
	return rec
}

// drillEpoch is the epoch-mode drill: a simulated VM checkpointer cuts an
// epoch every 40 launches, after the guest synchronized, and journals the
// guest's progress only once the cut is committed on the standby. The
// primary is killed after a synchronization but before the checkpointer's
// cut, so the standby discards that uncommitted epoch: the guest is told it
// was rolled back, "restores its VM" to the journal, and the promoted
// standby's GPU state must match the journal exactly.
func drillEpoch(g *pvdriver.Client, p *pair, f pvdriver.Function, cfg pvdriver.LaunchConfig, dd, bins pvdriver.DevicePtr, at int, rec drillRecord) drillRecord {
	const n, nbins, every = 1024, 16, 40
	at = at/every*every + every - 1 // strike right after a synchronization
	rec.AtLaunch = at
	journal := 0
	for i := 0; i < 400; i++ {
		err := g.Launch(f, cfg, pvdriver.Ptr(dd), pvdriver.U32(n), pvdriver.Ptr(bins), pvdriver.U32(nbins))
		if err == nil && i%every == every-1 {
			err = g.Synchronize()
			if err == nil && i == at {
				p.primary.Process.Kill()
			}
			if err == nil {
				var cut struct {
					Committed bool `json:"committed_on_standby"`
				}
				if body, perr := postAdmin(p.primaryAdmin, "/epoch", 5*time.Second); perr == nil && json.Unmarshal(body, &cut) == nil && cut.Committed {
					journal = i + 1 // the VM checkpoint that goes with this epoch
				}
			}
		}
		if errors.Is(err, pvdriver.ErrRolledBack) {
			g.AcceptRollback() // the VM is restored from its last checkpoint
			total, err := countLaunches(g, bins, n, nbins)
			if err != nil {
				rec.Problem = fmt.Sprintf("reading counters after the rollback: %v", err)
				return rec
			}
			rec.RolledBack = true
			rec.Failovers, rec.PauseMS = firstPause(g)
			var sst struct {
				Promotion *struct {
					DetectionMS float64 `json:"detection_ms"`
				}
			}
			if getJSON(p.standbyAdmin, &sst) == nil && sst.Promotion != nil {
				rec.DetectionMS = sst.Promotion.DetectionMS
			}
			rec.LostRequests = int64(journal) - total // launches the restored VM expects but the GPU lacks (or extra)
			rec.Passed = rec.LostRequests == 0
			if !rec.Passed {
				rec.Problem = fmt.Sprintf("GPU holds %d launches, the restored VM's journal %d", total, journal)
			}
			return rec
		}
		if err != nil {
			rec.Problem = fmt.Sprintf("launch %d: %v", i, err)
			return rec
		}
	}
	rec.Problem = "the kill never caused a rollback"
	return rec
}

// countLaunches reads the histogram's bins and returns how many launches of
// n elements they add up to.
func countLaunches(g *pvdriver.Client, bins pvdriver.DevicePtr, n, nbins int) (int64, error) {
	out := make([]byte, 4*nbins)
	if err := g.CopyDtoH(out, bins); err != nil {
		return 0, err
	}
	var total int64
	for b := 0; b < nbins; b++ {
		total += int64(binary.LittleEndian.Uint32(out[4*b:]))
	}
	return total / int64(n), nil
}

// firstPause returns how many failovers the guest went through and the
// pause of the first, in ms.
func firstPause(g *pvdriver.Client) (int, float64) {
	fo := g.Failovers()
	if len(fo) == 0 {
		return 0, 0
	}
	return len(fo), float64(fo[0].Resumed.Sub(fo[0].Lost).Microseconds()) / 1000
}
