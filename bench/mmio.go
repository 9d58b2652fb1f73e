package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"image/color"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/prometheus/client_golang/prometheus"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/internal/lab/mmioguest"
	"github.com/vgpuha/vgpuha/kmod/faultcount"
	"github.com/vgpuha/vgpuha/mmiotrace"
)

// MMIOOptions configure the MMIO tracing benchmark.
type MMIOOptions struct {
	// Guest is the guest program's command line (vgpuha mmio-guest); the
	// benchmark adds --addr, --workload, --writes, --aperture-bytes and
	// --threads.
	Guest []string
	// Modes to measure; "insn-step" is insn mode with emulation turned
	// off, so every store is single-stepped: the raw cost of a fault plus
	// a single step, measured beside the emulating tracer. It is measured
	// on the seq workload only, with a tenth of the writes (a single-stepped
	// REP MOVS costs a fault per byte). "insn-unpinned" is insn mode with
	// the tracer and guest free to run on any CPU (seq only), to show what
	// pinning saves.
	Modes []string
	// Workloads are mmio-guest workloads, each "NAME" or "NAME:PAGES"
	// (the memory aperture's size in pages; default ApertureBytes).
	Workloads []string
	// Writes per workload run, by workload name (bulk counts 8-byte words
	// copied; threads counts the stores of all threads together).
	Writes map[string]int
	// InsnWrites caps the writes of a cell in the insn modes and kmod,
	// where every store is a fault (0: no cap). ns/write is per store all
	// the same.
	InsnWrites int
	Threads    int  // OS threads of the threads workload
	Rounds     int  // interleaved rounds; cells report medians
	Pin        bool // pin the tracer and the guest's threads to one CPU
	// ApertureBytes is the memory aperture's size where a workload names
	// no page count.
	ApertureBytes uint64
	// Progress gets a line per cell measured; with Terminal the line is
	// rewritten in place (\r) instead.
	Progress io.Writer
	Terminal bool
}

// MMIOModes are every mode the benchmark knows, in the order it runs and
// prints them.
var MMIOModes = []string{"off", "page", "uffd", "auto", "kmod-page", "kmod-auto", "kmod", "insn", "insn-step", "insn-unpinned"}

// DefaultMMIOOptions is the default run (a few minutes on 2 cores); long
// gives more writes and rounds for careful figures.
func DefaultMMIOOptions(guest []string, long bool) MMIOOptions {
	o := MMIOOptions{
		Guest:         guest,
		Modes:         append([]string(nil), MMIOModes...),
		Workloads:     []string{"seq", "random", "bulk", "doorbell", "threads:256", "threads:16"},
		Writes:        map[string]int{"seq": 20000, "random": 20000, "bulk": 1 << 20, "doorbell": 5000, "threads": 4 * 5_000_000},
		InsnWrites:    200_000,
		Threads:       4,
		Rounds:        3,
		Pin:           true,
		ApertureBytes: 4 << 20,
	}
	o.Modes = slices.DeleteFunc(o.Modes, func(name string) bool { // uffd: Linux before 6.7; kmod: no module
		m, err := mmiotrace.ParseMode(name)
		return err == nil && mmiotrace.ModeAvailable(m) != nil
	})
	if long {
		o.Rounds = 7
		for k := range o.Writes {
			o.Writes[k] *= 5
		}
	}
	return o
}

// mmioCase is one workload at one aperture size.
type mmioCase struct {
	workload string
	pages    int
}

func parseMMIOCase(s string, defaultBytes uint64) (mmioCase, error) {
	name, pages, hasPages := strings.Cut(s, ":")
	c := mmioCase{workload: name, pages: int(defaultBytes / 4096)}
	if !slices.Contains(mmioguest.Workloads, name) {
		return c, fmt.Errorf("unknown workload %q (have: %s)", name, strings.Join(mmioguest.Workloads, ", "))
	}
	if hasPages {
		n, err := strconv.Atoi(pages)
		if err != nil || n < 1 || n > 1<<20 {
			return c, fmt.Errorf("workload %q: pages must be 1 to %d", s, 1<<20)
		}
		c.pages = n
	}
	return c, nil
}

// MMIOCell is one mode × workload measurement (medians over rounds).
type MMIOCell struct {
	Mode     string `json:"mode"`
	Workload string `json:"workload"`
	Pages    int    `json:"pages"`   // the memory aperture's size
	Threads  int    `json:"threads"` // storing at once (1 but for threads)
	// NsPerWrite is the guest's own time per store, calls included
	// (doorbell makes one call per five stores). With several threads it
	// is wall time over all their stores.
	NsPerWrite float64 `json:"ns_per_write"`
	// Slowdown is NsPerWrite over the off mode's in the same round.
	Slowdown float64 `json:"slowdown"`
	// FaultsPerWrite counts write faults the tracer handled.
	FaultsPerWrite float64 `json:"faults_per_write"`
	// KernelFaultsPerWrite counts every write fault the kernel took in the
	// guest process (kmod's eBPF counter), the Go runtime's own first
	// touches included — off mode shows that baseline. It sees what the
	// tracer cannot: uffd mode's faults, resolved inside the kernel. -1
	// where eBPF is unavailable.
	KernelFaultsPerWrite float64 `json:"kernel_faults_per_write"`
	// BytesPerWrite is aperture data put into the replication log per
	// store (the attach-time copy of the whole aperture excluded).
	BytesPerWrite float64 `json:"bytes_per_write"`
	Writes        uint64  `json:"writes"`
	// Verified: the device's copy of the apertures equalled the guest's
	// memory at the end (false is expected, and right, in off mode).
	Verified bool `json:"verified"`
}

// label names the cell's workload as the table and the plot show it.
func (c MMIOCell) label() string {
	if c.Threads > 1 {
		return fmt.Sprintf("%s×%d/%dp", c.Workload, c.Threads, c.Pages)
	}
	return fmt.Sprintf("%s/%dp", c.Workload, c.Pages)
}

// MMIO runs every workload in every mode, each as a fresh guest process
// served by a fresh primary (software GPU) in this process. The modes of
// one workload run back to back in each round, so each slowdown compares
// runs made side by side.
func MMIO(opts MMIOOptions) ([]MMIOCell, error) {
	var cases []mmioCase
	for _, w := range opts.Workloads {
		c, err := parseMMIOCase(w, opts.ApertureBytes)
		if err != nil {
			return nil, err
		}
		cases = append(cases, c)
	}
	type key struct {
		c    mmioCase
		mode string
	}
	samples := map[key][]MMIOCell{}
	for round := 0; round < opts.Rounds; round++ {
		for _, c := range cases {
			var off float64
			for _, m := range opts.Modes {
				if _, plain := mmiotrace.ParseMode(m); plain != nil && c.workload != "seq" { // a variant (insn-step...)
					continue
				}
				cell, err := mmioCell(opts, m, c)
				if err != nil {
					return nil, fmt.Errorf("%s/%s: %w", m, c.workload, err)
				}
				if m == "off" {
					off = cell.NsPerWrite
				}
				if off > 0 {
					cell.Slowdown = cell.NsPerWrite / off
				}
				samples[key{c, m}] = append(samples[key{c, m}], cell)
				opts.progress(round, cell)
			}
		}
	}
	if opts.Progress != nil && opts.Terminal {
		fmt.Fprintln(opts.Progress)
	}
	var cells []MMIOCell
	for _, c := range cases {
		for _, m := range opts.Modes {
			if s := samples[key{c, m}]; len(s) > 0 {
				cells = append(cells, medianCell(s))
			}
		}
	}
	return cells, nil
}

func (o MMIOOptions) progress(round int, c MMIOCell) {
	if o.Progress == nil {
		return
	}
	line := fmt.Sprintf("round %d/%d  %-14s %-13s %10.1f ns/write", round+1, o.Rounds, c.label(), c.Mode, c.NsPerWrite)
	if o.Terminal {
		fmt.Fprintf(o.Progress, "\r%s   ", line)
		return
	}
	fmt.Fprintln(o.Progress, line)
}

// medianCell is the first sample with every figure the median over the
// samples, and verified only if every sample was.
func medianCell(s []MMIOCell) MMIOCell {
	c := s[0]
	c.NsPerWrite = medianOf(s, func(c MMIOCell) float64 { return c.NsPerWrite })
	c.Slowdown = medianOf(s, func(c MMIOCell) float64 { return c.Slowdown })
	c.FaultsPerWrite = medianOf(s, func(c MMIOCell) float64 { return c.FaultsPerWrite })
	c.KernelFaultsPerWrite = medianOf(s, func(c MMIOCell) float64 { return c.KernelFaultsPerWrite })
	c.BytesPerWrite = medianOf(s, func(c MMIOCell) float64 { return c.BytesPerWrite })
	for _, x := range s {
		c.Verified = c.Verified && x.Verified
	}
	return c
}

func medianOf(s []MMIOCell, f func(MMIOCell) float64) float64 {
	v := make([]float64, len(s))
	for i, c := range s {
		v[i] = f(c)
	}
	return median(v)
}

// mmioCell runs one guest under one mode and reads the tracer's counters.
func mmioCell(opts MMIOOptions, mode string, mc mmioCase) (MMIOCell, error) {
	cfg := hypervisor.DefaultConfig()
	base, variant := mode, ""
	m, err := mmiotrace.ParseMode(mode)
	if err != nil { // a variant of a mode: insn-step, insn-unpinned
		base, variant, _ = strings.Cut(mode, "-")
		if m, err = mmiotrace.ParseMode(base); err != nil {
			return MMIOCell{}, err
		}
	}
	cfg.MMIO.Mode, cfg.MMIO.StepOnly, cfg.MMIO.Pin = m, variant == "step", opts.Pin && variant != "unpinned"
	reg := prometheus.NewRegistry()
	srv, err := hypervisor.NewServer(sim.New(1<<30), cfg, reg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return MMIOCell{}, err
	}
	defer srv.Close()
	dir, err := os.MkdirTemp("", "vgpuha-bench-mmio")
	if err != nil {
		return MMIOCell{}, err
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "guest.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return MMIOCell{}, err
	}
	go srv.Serve(ln)

	writes := opts.Writes[mc.workload]
	if cfg.MMIO.StepOnly {
		writes = max(writes/10, 100)
	}
	if (base == "insn" || mode == "kmod") && opts.InsnWrites > 0 { // every store a fault
		writes = min(writes, opts.InsnWrites)
	}
	threads := 1
	if mc.workload == "threads" {
		threads = max(opts.Threads, 1)
	}
	apertureBytes := uint64(mc.pages) * 4096
	args := append(append([]string(nil), opts.Guest[1:]...), "--addr", "unix://"+sock, "--workload", mc.workload,
		"--writes", strconv.Itoa(writes), "--aperture-bytes", strconv.FormatUint(apertureBytes, 10), "--threads", strconv.Itoa(threads))
	res, kernelWrites, err := runMMIOGuest(opts.Guest[0], args)
	if err != nil {
		return MMIOCell{}, err
	}
	// The attach of each aperture copies it whole once; that is not the
	// workload's traffic.
	attached := float64(apertureBytes)
	if mc.workload == "doorbell" {
		attached += 4096
	}
	counters := mmiotrace.SumCounters(reg)
	w := float64(res.Writes)
	kernel := -1.0
	if kernelWrites >= 0 {
		kernel = float64(kernelWrites) / w
	}
	return MMIOCell{
		Mode: mode, Workload: mc.workload, Pages: mc.pages, Threads: threads, Writes: res.Writes, Verified: res.Verified,
		NsPerWrite:           float64(res.Nanos) / w,
		FaultsPerWrite:       counters["vgpuha_mmio_faults_total"] / w,
		KernelFaultsPerWrite: kernel,
		BytesPerWrite:        max(0, counters["vgpuha_mmio_bytes_total"]-attached) / w,
	}, nil
}

// runMMIOGuest runs the guest program to its end and returns its result
// and the write faults the kernel counted in it (-1: no eBPF counter).
func runMMIOGuest(prog string, args []string) (mmioguest.Result, int64, error) {
	cmd := mmiotrace.GuestCommand(exec.Command(prog, args...))
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		return mmioguest.Result{}, 0, err
	}
	kfaults, kerr := faultcount.NewFaultCounter(cmd.Process.Pid, 0, 1<<47)
	if kerr == nil {
		defer kfaults.Close()
	}
	if err := mmiotrace.WaitExit(cmd); err != nil {
		return mmioguest.Result{}, 0, fmt.Errorf("guest: %v: %s", err, errOut.String())
	}
	var res mmioguest.Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil || res.Writes == 0 {
		return res, 0, fmt.Errorf("guest said %q: %v", out.String(), err)
	}
	kernel := int64(-1)
	if kerr == nil {
		if _, writes, err := kfaults.Counts(); err == nil {
			kernel = int64(writes)
		}
	}
	return res, kernel, nil
}

// PrintMMIO writes the cells as a table, one row per workload and mode;
// "vs off" is the slowdown against untraced stores, measured side by side.
func PrintMMIO(w io.Writer, cells []MMIOCell) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\tmode\tstores\tns/store\tvs off\tfaults/store\tkernel faults/store\tbytes/store\tdevice copy ok\t")
	for _, c := range cells {
		kernel := "n/a"
		if c.KernelFaultsPerWrite >= 0 {
			kernel = fmt.Sprintf("%.4f", c.KernelFaultsPerWrite)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.1f\t%.2fx\t%.4f\t%s\t%.2f\t%v\t\n", c.label(), c.Mode, c.Writes, c.NsPerWrite, c.Slowdown, c.FaultsPerWrite, kernel, c.BytesPerWrite, c.Verified)
	}
	tw.Flush()
}

// PlotMMIO draws ns per write per workload, one bar per mode, on a log
// scale, to path (.png or .svg).
func PlotMMIO(path string, cells []MMIOCell) error {
	p := plot.New()
	p.Title.Text = "vgpuha MMIO tracing: guest time per write"
	p.Y.Label.Text = "time per write (log scale)"
	// Bars of log10(ns) on a linear axis labelled in powers of ten: gonum's
	// log scale cannot draw bars, which start at zero.
	p.Y.Tick.Marker = plot.TickerFunc(func(_, hi float64) []plot.Tick {
		var ticks []plot.Tick
		for k := 0; float64(k) <= hi+1; k++ {
			ticks = append(ticks, plot.Tick{Value: float64(k), Label: [...]string{"1 ns", "10 ns", "100 ns", "1 µs", "10 µs", "100 µs", "1 ms", "10 ms", "100 ms"}[min(k, 8)]})
		}
		return ticks
	})
	var workloads, modes []string
	seen := map[string]bool{}
	for _, c := range cells {
		if !seen["w"+c.label()] {
			seen["w"+c.label()] = true
			workloads = append(workloads, c.label())
		}
		if !seen["m"+c.Mode] {
			seen["m"+c.Mode] = true
			modes = append(modes, c.Mode)
		}
	}
	width := vg.Points(12)
	for i, m := range modes {
		vals := make(plotter.Values, len(workloads))
		for j, w := range workloads {
			for _, c := range cells {
				if c.Mode == m && c.label() == w {
					vals[j] = math.Log10(max(c.NsPerWrite, 1))
				}
			}
		}
		bars, err := plotter.NewBarChart(vals, width)
		if err != nil {
			return err
		}
		bars.Offset = vg.Length(float64(i)-float64(len(modes)-1)/2) * width
		bars.Color = plotColors[i%len(plotColors)]
		bars.LineStyle.Width = 0
		p.Add(bars)
		p.Legend.Add(m, bars)
	}
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.XOffs = vg.Points(8)
	p.Y.Min = 0
	p.Y.Max = math.Ceil(p.Y.Max) + 1.5 // room for the legend above the bars
	p.NominalX(workloads...)
	return p.Save(vg.Points(float64(120*len(workloads)+120)), 5*vg.Inch, path)
}

var plotColors = []color.Color{
	color.RGBA{0x88, 0x88, 0x88, 0xff}, color.RGBA{0xd6, 0x27, 0x28, 0xff}, color.RGBA{0x1f, 0x77, 0xb4, 0xff},
	color.RGBA{0x2c, 0xa0, 0x2c, 0xff}, color.RGBA{0xff, 0x7f, 0x0e, 0xff}, color.RGBA{0x94, 0x67, 0xbd, 0xff},
}
