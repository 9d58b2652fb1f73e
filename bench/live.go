package bench

import (
	"fmt"
	"os"
	"time"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
)

// ReplicateLive measures a running deployment from this guest process: a
// primary at endpoint, replicating to its standby in the mode it was
// started with (its own processes, on its own GPUs), side by side with the
// same calls on opts.NewBackend in-process. Rows: the bulk host-to-device
// copy (ended by a 64-byte read, so in commit mode it includes the standby
// holding every byte), and the latency of a 64-byte copy each way; the
// added figures are over the in-process backend. Rounds interleave.
func ReplicateLive(opts ReplicateOptions, endpoint string) (ReplicateReport, error) {
	if opts.BulkBytes <= 0 {
		opts.BulkBytes = 256 << 20
	}
	opts.Rounds, opts.Calls = max(opts.Rounds, 1), max(opts.Calls, 1)
	if opts.NewBackend == nil {
		opts.NewBackend = func() (gpu.Backend, error) { return sim.New(uint64(opts.BulkBytes) + 64<<20), nil }
	}
	dir, err := os.MkdirTemp("", "vgpuha-bench")
	if err != nil {
		return ReplicateReport{}, err
	}
	defer os.RemoveAll(dir)
	targets, closeAll, err := pvTargets(PVOptions{NewBackend: opts.NewBackend, BulkBytes: opts.BulkBytes, Endpoint: endpoint}, dir)
	defer closeAll()
	if err != nil {
		return ReplicateReport{}, err
	}
	timings := []struct {
		n   int
		run func(target) error
	}{
		{1, func(t target) error {
			if err := t.bulk(); err != nil {
				return err
			}
			return t.read()
		}},
		{opts.Calls, func(t target) error { return t.syncCall() }},
		{opts.Calls, func(t target) error { return t.read() }},
	}
	ns := make([][][]float64, len(timings)) // [timing][target] samples
	for i := range ns {
		ns[i] = make([][]float64, len(targets))
	}
	for round := range opts.Rounds {
		for i, tm := range timings {
			for ti, t := range targets {
				start := time.Now()
				for range tm.n {
					if err := tm.run(t); err != nil {
						return ReplicateReport{}, fmt.Errorf("%s: %w", t.transport, err)
					}
				}
				ns[i][ti] = append(ns[i][ti], float64(time.Since(start).Nanoseconds())/float64(tm.n))
			}
		}
		if opts.Progress != nil {
			fmt.Fprintf(opts.Progress, "round %d/%d done\n", round+1, opts.Rounds)
		}
	}
	return liveReport(opts.BulkBytes, targets, ns), nil
}

// liveReport turns ReplicateLive's samples into medians.
func liveReport(bulkBytes int, targets []target, ns [][][]float64) ReplicateReport {
	rep := ReplicateReport{Baseline: targets[0].transport}
	base := median(ns[0][0])
	for ti, t := range targets {
		m := median(ns[0][ti])
		rep.Throughput = append(rep.Throughput, ThroughputRow{Path: t.transport, MBPerSec: float64(bulkBytes) / m * 1e3, VsTCPCopy: base / m})
	}
	for ci, call := range []string{"copy_htod_64B", "copy_dtoh_64B"} {
		none := median(ns[ci+1][0])
		for ti, t := range targets {
			m := median(ns[ci+1][ti])
			rep.Latency = append(rep.Latency, LatencyRow{Call: call, Mode: t.transport, NsPerOp: m, AddedNs: m - none})
		}
	}
	return rep
}
