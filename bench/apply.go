package bench

import (
	"fmt"
	"io"
	"log/slog"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/cuda"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/replica"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
)

// ApplyRow is one way of getting bulk data into device memory.
type ApplyRow struct {
	Path     string  `json:"path"`
	GBPerSec float64 `json:"gb_per_s"`
	// VsBaseline divides by the last row: a pinned cuMemcpyHtoD loop on
	// CUDA, a plain backend copy on the software GPU.
	VsBaseline float64 `json:"vs_baseline"`
}

// Apply measures how fast a standby applies replicated bulk host-to-device
// records (decode, validate, copy, exactly as the standby does) against the
// fastest plain copy the backend offers, interleaved round by round.
func Apply(newBackend func() (gpu.Backend, error), chunk, total, rounds int, progress io.Writer) ([]ApplyRow, error) {
	backend, err := newBackend()
	if err != nil {
		return nil, err
	}
	discard := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := hypervisor.NewServer(backend, hypervisor.DefaultConfig(), prometheus.NewRegistry(), discard)
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	applier := replica.New(srv, discard)
	const session, base = 1, 0x7e0000000000
	if err := applier.Apply(&replicate.Record{Op: replicate.OpSessionOpen, Session: session, Result: base, Body: []byte("bench")}); err != nil {
		return nil, err
	}
	alloc := &replicate.Record{Seq: 1, Session: session, Op: replicate.Op(abi.OpAlloc), Result: base, Body: (&abi.Alloc{Size: uint64(chunk)}).Append(nil)}
	if err := applier.Apply(alloc); err != nil {
		return nil, err
	}
	// The record body lies where the standby's link receives it: in
	// page-locked memory where the backend offers it.
	buf := make([]byte, chunk+64)
	if ha, ok := backend.(gpu.HostAllocator); ok {
		if buf, err = ha.AllocHost(chunk + 64); err != nil {
			return nil, err
		}
	}
	data := make([]byte, chunk)
	for i := range data {
		data[i] = byte(i)
	}
	rec := &replicate.Record{Session: session, Op: replicate.Op(abi.OpCopyHtoD), Body: (&abi.CopyHtoD{Dst: base, Data: data}).Append(buf[:0])}

	ctx, err := backend.NewContext(0x7f0000000000, 1<<30)
	if err != nil {
		return nil, err
	}
	defer ctx.Close()
	dbase, _ := ctx.Window()
	if err := ctx.Alloc(dbase, uint64((chunk+(2<<20)-1)/(2<<20)*(2<<20))); err != nil {
		return nil, err
	}
	type path struct {
		name string
		copy func() error
	}
	paths := []path{
		{"standby apply of 16 MiB records (decode, validate, copy from the receive buffer; link excluded)", func() error { return applier.Apply(rec) }},
		{"backend CopyHtoD, pageable Go memory", func() error { return ctx.CopyHtoD(dbase, data, 0) }},
	}
	if cb, ok := backend.(*cuda.Backend); ok {
		pinned, release, err := cb.PinnedCopy(ctx, dbase, chunk)
		if err != nil {
			return nil, err
		}
		defer release()
		paths = append(paths, path{"cuMemcpyHtoD from pinned memory", pinned})
	}
	ns := make([][]float64, len(paths))
	n := max(1, total/chunk)
	for r := 0; r < rounds; r++ {
		for i, p := range paths {
			start := time.Now()
			for range n {
				if err := p.copy(); err != nil {
					return nil, fmt.Errorf("%s: %w", p.name, err)
				}
			}
			ctx.Sync()
			ns[i] = append(ns[i], float64(time.Since(start).Nanoseconds()))
		}
		if progress != nil {
			fmt.Fprintf(progress, "round %d/%d done\n", r+1, rounds)
		}
	}
	var rows []ApplyRow
	base_ := median(ns[len(ns)-1])
	for i, p := range paths {
		m := median(ns[i])
		rows = append(rows, ApplyRow{Path: p.name, GBPerSec: float64(n*chunk) / m, VsBaseline: base_ / m})
	}
	return rows, nil
}

// PrintApply writes the report as a table.
func PrintApply(w io.Writer, rows []ApplyRow) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "bulk host->device path\tGB/s\tvs baseline\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t\n", r.Path, r.GBPerSec, r.VsBaseline)
	}
	tw.Flush()
}
