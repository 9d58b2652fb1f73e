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
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/prometheus/client_golang/prometheus"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/internal/mmioguest"
	"github.com/vgpuha/vgpuha/kmod"
	"github.com/vgpuha/vgpuha/mmiotrace"
)

// MMIOOptions configure the MMIO tracing benchmark.
type MMIOOptions struct {
	// Guest is the guest program's command line (vgpuha mmio-guest); the
	// benchmark adds --addr, --workload and --writes.
	Guest []string
	// Modes to measure; "insn-step" is insn mode with emulation turned
	// off, so every store is single-stepped: the raw cost of a fault plus
	// a single step, measured beside the emulating tracer. It is measured
	// on the seq workload only, with a tenth of the writes (a single-stepped
	// REP MOVS costs a fault per byte). "insn-unpinned" is insn mode with
	// the tracer and guest free to run on any CPU (seq only), to show what
	// pinning saves.
	Modes     []string
	Workloads []string
	// Writes per workload run (bulk counts 8-byte words copied).
	Writes map[string]int
	Rounds int  // interleaved rounds; cells report medians
	Pin    bool // pin the tracer and the guest's threads to one CPU
	// ApertureBytes is the memory aperture's size.
	ApertureBytes uint64
	Progress      io.Writer
}

// DefaultMMIOOptions is the default run (under a minute on 2 cores); long
// gives more writes and rounds for careful figures.
func DefaultMMIOOptions(guest []string, long bool) MMIOOptions {
	o := MMIOOptions{
		Guest:         guest,
		Modes:         []string{"off", "insn", "page", "uffd", "insn-step", "insn-unpinned"},
		Workloads:     []string{"seq", "random", "bulk", "doorbell"},
		Writes:        map[string]int{"seq": 20000, "random": 20000, "bulk": 1 << 20, "doorbell": 5000},
		Rounds:        3,
		Pin:           true,
		ApertureBytes: 4 << 20,
	}
	if mmiotrace.UffdAvailable() != nil { // Linux before 6.7
		o.Modes = []string{"off", "insn", "page", "insn-step", "insn-unpinned"}
	}
	if long {
		o.Rounds = 7
		for k := range o.Writes {
			o.Writes[k] *= 5
		}
	}
	return o
}

// MMIOCell is one mode × workload measurement (medians over rounds).
type MMIOCell struct {
	Mode     string `json:"mode"`
	Workload string `json:"workload"`
	// NsPerWrite is the guest's own time per store, calls included
	// (doorbell makes one call per five stores).
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

// MMIO runs every workload in every mode, each as a fresh guest process
// served by a fresh primary (software GPU) in this process.
func MMIO(opts MMIOOptions) ([]MMIOCell, error) {
	type key struct{ mode, workload string }
	samples := map[key][]MMIOCell{}
	for round := 0; round < opts.Rounds; round++ {
		for _, w := range opts.Workloads {
			var off float64
			for _, m := range opts.Modes {
				if strings.Contains(m, "-") && w != "seq" {
					continue
				}
				c, err := mmioCell(opts, m, w)
				if err != nil {
					return nil, fmt.Errorf("%s/%s: %w", m, w, err)
				}
				if m == "off" {
					off = c.NsPerWrite
				}
				if off > 0 {
					c.Slowdown = c.NsPerWrite / off
				}
				samples[key{m, w}] = append(samples[key{m, w}], c)
				if opts.Progress != nil {
					fmt.Fprintf(opts.Progress, "\rround %d/%d  %-9s %-9s %10.0f ns/write   ", round+1, opts.Rounds, m, w, c.NsPerWrite)
				}
			}
		}
	}
	if opts.Progress != nil {
		fmt.Fprintln(opts.Progress)
	}
	var cells []MMIOCell
	for _, w := range opts.Workloads {
		for _, m := range opts.Modes {
			s := samples[key{m, w}]
			if len(s) == 0 {
				continue
			}
			c := s[0]
			c.NsPerWrite = medianOf(s, func(c MMIOCell) float64 { return c.NsPerWrite })
			c.Slowdown = medianOf(s, func(c MMIOCell) float64 { return c.Slowdown })
			c.FaultsPerWrite = medianOf(s, func(c MMIOCell) float64 { return c.FaultsPerWrite })
			c.KernelFaultsPerWrite = medianOf(s, func(c MMIOCell) float64 { return c.KernelFaultsPerWrite })
			c.BytesPerWrite = medianOf(s, func(c MMIOCell) float64 { return c.BytesPerWrite })
			for _, x := range s {
				c.Verified = c.Verified && x.Verified
			}
			cells = append(cells, c)
		}
	}
	return cells, nil
}

func medianOf(s []MMIOCell, f func(MMIOCell) float64) float64 {
	v := make([]float64, len(s))
	for i, c := range s {
		v[i] = f(c)
	}
	return median(v)
}

// mmioCell runs one guest under one mode and reads the tracer's counters.
func mmioCell(opts MMIOOptions, mode, workload string) (MMIOCell, error) {
	cfg := hypervisor.DefaultConfig()
	base, variant, _ := strings.Cut(mode, "-")
	m, err := mmiotrace.ParseMode(base)
	if err != nil {
		return MMIOCell{}, err
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

	writes := opts.Writes[workload]
	if cfg.MMIO.StepOnly {
		writes = max(writes/10, 100)
	}
	args := append(append([]string(nil), opts.Guest[1:]...), "--addr", "unix://"+sock, "--workload", workload,
		"--writes", strconv.Itoa(writes), "--aperture-bytes", strconv.FormatUint(opts.ApertureBytes, 10))
	cmd := mmiotrace.GuestCommand(exec.Command(opts.Guest[0], args...))
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		return MMIOCell{}, err
	}
	kfaults, kerr := kmod.NewFaultCounter(cmd.Process.Pid, 0, 1<<47)
	if kerr == nil {
		defer kfaults.Close()
	}
	if err := mmiotrace.WaitExit(cmd); err != nil {
		return MMIOCell{}, fmt.Errorf("guest: %v: %s", err, errOut.String())
	}
	var res mmioguest.Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil || res.Writes == 0 {
		return MMIOCell{}, fmt.Errorf("guest said %q: %v", out.String(), err)
	}
	// The attach of each aperture copies it whole once; that is not the
	// workload's traffic.
	attached := float64(opts.ApertureBytes)
	if workload == "doorbell" {
		attached += 4096
	}
	counters := SumCounters(reg)
	w := float64(res.Writes)
	kernel := -1.0
	if kerr == nil {
		if _, writes, err := kfaults.Counts(); err == nil {
			kernel = float64(writes) / w
		}
	}
	return MMIOCell{
		Mode: mode, Workload: workload, Writes: res.Writes, Verified: res.Verified,
		NsPerWrite:           float64(res.Nanos) / w,
		FaultsPerWrite:       counters["vgpuha_mmio_faults_total"] / w,
		KernelFaultsPerWrite: kernel,
		BytesPerWrite:        max(0, counters["vgpuha_mmio_bytes_total"]-attached) / w,
	}, nil
}

// SumCounters sums each counter family of reg over its labels.
func SumCounters(reg prometheus.Gatherer) map[string]float64 {
	out := map[string]float64{}
	families, _ := reg.Gather()
	for _, f := range families {
		for _, m := range f.GetMetric() {
			out[f.GetName()] += m.GetCounter().GetValue()
		}
	}
	return out
}

// PrintMMIO writes the cells as a table, one row per workload and mode.
func PrintMMIO(w io.Writer, cells []MMIOCell) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\tmode\tns/write\tslowdown\tfaults/write\tkernel faults/write\tbytes/write\tdevice copy ok\t")
	for _, c := range cells {
		kernel := "n/a"
		if c.KernelFaultsPerWrite >= 0 {
			kernel = fmt.Sprintf("%.3f", c.KernelFaultsPerWrite)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.1fx\t%.3f\t%s\t%.1f\t%v\t\n", c.Workload, c.Mode, c.NsPerWrite, c.Slowdown, c.FaultsPerWrite, kernel, c.BytesPerWrite, c.Verified)
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
		if !seen["w"+c.Workload] {
			seen["w"+c.Workload] = true
			workloads = append(workloads, c.Workload)
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
				if c.Mode == m && c.Workload == w {
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
