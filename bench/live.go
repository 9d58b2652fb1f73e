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
	send, closeTCP, err := plainTCP()
	if err != nil {
		return ReplicateReport{}, err
	}
	defer closeTCP()
	raw := make([]byte, opts.BulkBytes)
	s := liveSamples{ns: make([][][]float64, len(liveTimings(opts))), pinned: make([][]float64, len(targets))}
	for i := range s.ns {
		s.ns[i] = make([][]float64, len(targets))
	}
	for round := range opts.Rounds {
		start := time.Now()
		if err := send(raw); err != nil {
			return ReplicateReport{}, fmt.Errorf("raw tcp: %w", err)
		}
		s.raw = append(s.raw, float64(time.Since(start).Nanoseconds()))
		if err := s.round(opts, targets); err != nil {
			return ReplicateReport{}, err
		}
		if opts.Progress != nil {
			fmt.Fprintf(opts.Progress, "round %d/%d done\n", round+1, opts.Rounds)
		}
	}
	return liveReport(opts.BulkBytes, targets, s), nil
}

// liveTiming is one thing ReplicateLive times, n times per sample.
type liveTiming struct {
	n   int
	run func(target) error
}

// liveTimings: the bulk copy from ordinary memory (ended by a 64-byte
// read, so in commit mode it includes the standby holding every byte),
// then the two small calls.
func liveTimings(opts ReplicateOptions) []liveTiming {
	return []liveTiming{
		{1, func(t target) error {
			if err := t.bulk(); err != nil {
				return err
			}
			return t.read()
		}},
		{opts.Calls, func(t target) error { return t.syncCall() }},
		{opts.Calls, func(t target) error { return t.read() }},
	}
}

// liveSamples are ReplicateLive's timings in ns: ns[timing][target], the
// bulk copy from page-locked memory per target (where it has some), and
// the raw TCP link's.
type liveSamples struct {
	ns     [][][]float64
	pinned [][]float64
	raw    []float64
}

// round takes one sample of every timing on every target.
func (s *liveSamples) round(opts ReplicateOptions, targets []target) error {
	for i, tm := range liveTimings(opts) {
		for ti, t := range targets {
			start := time.Now()
			for range tm.n {
				if err := tm.run(t); err != nil {
					return fmt.Errorf("%s: %w", t.transport, err)
				}
			}
			s.ns[i][ti] = append(s.ns[i][ti], float64(time.Since(start).Nanoseconds())/float64(tm.n))
		}
	}
	for ti, t := range targets {
		if t.pinned == nil {
			continue
		}
		start := time.Now()
		if err := t.pinned(); err != nil {
			return fmt.Errorf("%s pinned: %w", t.transport, err)
		}
		if err := t.read(); err != nil {
			return fmt.Errorf("%s: %w", t.transport, err)
		}
		s.pinned[ti] = append(s.pinned[ti], float64(time.Since(start).Nanoseconds()))
	}
	return nil
}

// liveReport turns ReplicateLive's samples into medians. Throughput is
// compared with the raw TCP link (a loopback connection carrying the same
// bytes, no encryption), the latency with the in-process backend.
func liveReport(bulkBytes int, targets []target, s liveSamples) ReplicateReport {
	rep := ReplicateReport{Baseline: "raw tcp link"}
	base := median(s.raw)
	row := func(path string, ns float64) {
		rep.Throughput = append(rep.Throughput, ThroughputRow{Path: path, MBPerSec: float64(bulkBytes) / ns * 1e3, VsTCPCopy: base / ns})
	}
	row("raw tcp link", base)
	for ti, t := range targets {
		row(t.transport, median(s.ns[0][ti]))
		if len(s.pinned[ti]) > 0 {
			row(t.transport+" pinned", median(s.pinned[ti]))
		}
	}
	for ci, call := range []string{"copy_htod_64B", "copy_dtoh_64B"} {
		none := median(s.ns[ci+1][0])
		for ti, t := range targets {
			m := median(s.ns[ci+1][ti])
			rep.Latency = append(rep.Latency, LatencyRow{Call: call, Mode: t.transport, NsPerOp: m, AddedNs: m - none})
		}
	}
	return rep
}
