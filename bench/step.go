package bench

import (
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"time"
)

// The library's request pipeline on a recorded training step (issue 43):
// the calls one step of torchvision's ResNet-18 in fp16 AMP makes through
// libcuda.so.1, replayed through a pvdriver client against a primary on
// the software GPU, over each transport, beside the same calls on the
// backend in-process. It shows how many of a step's requests wait for an
// answer (only the program's own: its copies to the host and its
// synchronisation) and what a step's calls cost the guest and the node,
// the GPU's work aside (the software GPU's kernels are tiny).

// stepShape is one training step's calls.
type stepShape struct {
	launches, memsets, reads, syncs int
}

// resnetStep is a ResNet-18 step (fp16 AMP, GradScaler, channels_last) as
// counted on an H200 with VGPUHA_STATS=1, 12 steps against 32, 2026-11-29:
// 111 launches and 46 memsets sent without waiting, 6 copies to the host
// (the loss and GradScaler's finite checks) and about one synchronisation.
var resnetStep = stepShape{launches: 111, memsets: 46, reads: 6, syncs: 1}

// StepRow is one transport's figures for a step.
type StepRow struct {
	Transport    string  `json:"transport"`
	StepsPerSec  float64 `json:"steps_per_sec"`
	UsPerStep    float64 `json:"us_per_step"`
	WaitsPerStep float64 `json:"waits_per_step"` // -1 in-process
	VsDirect     float64 `json:"vs_direct"`      // time per step against the in-process backend's
}

// Step replays steps recorded ResNet steps on every transport (and the
// backend in-process) and reports each.
func Step(steps int) ([]StepRow, error) {
	dir, err := os.MkdirTemp("", "vgpuha-step")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	targets, closeAll, err := pvTargets(PVOptions{BulkBytes: 4096}, dir)
	defer closeAll()
	if err != nil {
		return nil, err
	}
	var rows []StepRow
	for _, t := range targets {
		if err := runStep(t, resnetStep); err != nil { // warm: the first step's costs aside
			return nil, fmt.Errorf("%s: %w", t.transport, err)
		}
		var before uint64
		if t.waited != nil {
			before = t.waited()
		}
		start := time.Now()
		for range steps {
			if err := runStep(t, resnetStep); err != nil {
				return nil, fmt.Errorf("%s: %w", t.transport, err)
			}
		}
		el := time.Since(start)
		row := StepRow{Transport: t.transport, StepsPerSec: float64(steps) / el.Seconds(),
			UsPerStep: float64(el.Microseconds()) / float64(steps), WaitsPerStep: -1}
		if t.waited != nil {
			row.WaitsPerStep = float64(t.waited()-before) / float64(steps)
		}
		rows = append(rows, row)
	}
	for i := range rows {
		rows[i].VsDirect = rows[i].UsPerStep / rows[0].UsPerStep
	}
	return rows, nil
}

// runStep issues one step's calls in the order a step makes them: the
// memsets and the reads spread among the launches, the synchronisation
// last.
func runStep(t target, s stepShape) error {
	memsetEvery, readEvery := max(s.launches/max(s.memsets, 1), 1), max(s.launches/max(s.reads, 1), 1)
	memsets, reads := 0, 0
	for i := range s.launches {
		if err := t.launch(); err != nil {
			return err
		}
		if i%memsetEvery == 0 && memsets < s.memsets {
			if err := t.memset(); err != nil {
				return err
			}
			memsets++
		}
		if i%readEvery == readEvery-1 && reads < s.reads {
			if err := t.read(); err != nil {
				return err
			}
			reads++
		}
	}
	for ; memsets < s.memsets; memsets++ {
		if err := t.memset(); err != nil {
			return err
		}
	}
	for range s.syncs {
		if err := t.flush(); err != nil {
			return err
		}
	}
	return nil
}

// StepLive replays steps recorded steps in each of guests sessions at
// once against a running node at endpoint (as many guest programs on one
// primary: with --guest.workers each session has a worker, and a standby
// applies each one's log in a lane of its own), after one step each to
// warm. The one row sums the guests' steps/s; µs/step is a guest's mean
// and waits/step the requests a guest waited for per step.
func StepLive(endpoint string, guests, steps int) (StepRow, error) {
	if guests < 1 || steps < 1 {
		return StepRow{}, fmt.Errorf("want at least one guest and one step, not %d and %d", guests, steps)
	}
	ts := make([]target, guests)
	for i := range ts {
		t, closer, err := clientTarget(endpoint, 4096)
		if err != nil {
			return StepRow{}, fmt.Errorf("guest %d: %w", i, err)
		}
		defer closer()
		if err := runStep(t, resnetStep); err != nil {
			return StepRow{}, fmt.Errorf("guest %d: %w", i, err)
		}
		ts[i] = t
	}
	errs := make(chan error, guests)
	var waits atomic.Uint64
	start := time.Now()
	for _, t := range ts {
		go func() {
			before := t.waited()
			for range steps {
				if err := runStep(t, resnetStep); err != nil {
					errs <- err
					return
				}
			}
			waits.Add(t.waited() - before)
			errs <- nil
		}()
	}
	for range guests {
		if err := <-errs; err != nil {
			return StepRow{}, err
		}
	}
	el := time.Since(start)
	n := float64(guests * steps)
	return StepRow{Transport: fmt.Sprintf("%s x%d", ts[0].transport, guests), StepsPerSec: n / el.Seconds(),
		UsPerStep: float64(el.Microseconds()) / float64(steps), WaitsPerStep: float64(waits.Load()) / n}, nil
}

// PrintStep writes Step's rows as a table.
func PrintStep(w io.Writer, rows []StepRow) {
	fmt.Fprintf(w, "a recorded ResNet-18 step (%d launches, %d memsets, %d copies to the host, %d synchronisation), software GPU\n",
		resnetStep.launches, resnetStep.memsets, resnetStep.reads, resnetStep.syncs)
	fmt.Fprintf(w, "%-16s %12s %12s %14s %10s\n", "transport", "steps/s", "µs/step", "waits/step", "× direct")
	for _, r := range rows {
		waits := fmt.Sprintf("%.2f", r.WaitsPerStep)
		if r.WaitsPerStep < 0 {
			waits = "-"
		}
		fmt.Fprintf(w, "%-16s %12.0f %12.1f %14s %10.2f\n", r.Transport, r.StepsPerSec, r.UsPerStep, waits, r.VsDirect)
	}
}
