package bench

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/pvdriver/transport"
)

// TestPVRuns checks the harness end to end on a tiny run: every
// configuration is measured and the direct row is the unit of the ratios.
// It asserts nothing about speed.
func TestPVRuns(t *testing.T) {
	rows, err := PV(PVOptions{Rounds: 1, Batch: 20, BulkBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	transports := 3 // direct, unix, tcp
	if runtime.GOOS == "linux" {
		transports++ // shm+unix
	}
	pinned := 1 // direct; shm+unix copies from its host-memory region
	if runtime.GOOS == "linux" {
		pinned++
	}
	if len(rows) != 4*transports+pinned {
		t.Fatalf("got %d rows, want 4 ops x %d transports and %d pinned bulk copies", len(rows), transports, pinned)
	}
	for _, r := range rows {
		if r.NsPerOp <= 0 || (r.Transport == "direct-sim" && r.VsDirect != 1) || (r.Bytes > 0) != (r.MBPerSec > 0) {
			t.Errorf("implausible row %+v", r)
		}
	}
}

// BenchmarkPV reports the same figures through go test -bench.
func BenchmarkPV(b *testing.B) {
	rows, err := PV(PVOptions{Rounds: 3, Batch: max(b.N, 100)})
	if err != nil {
		b.Fatal(err)
	}
	for _, r := range rows {
		b.ReportMetric(r.NsPerOp, r.Op+"_"+r.Transport+"_ns/op")
		b.ReportMetric(r.VsDirect, r.Op+"_"+r.Transport+"_x_direct")
	}
}

func TestReplicateRuns(t *testing.T) {
	rep, err := Replicate(ReplicateOptions{BulkBytes: 1 << 20, Rounds: 1, Calls: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Throughput) != 3 || len(rep.Latency) != 10 || len(rep.Resync) != 2 || rep.Resync[1].ResyncMS <= 0 {
		t.Fatalf("report: %+v", rep)
	}
	for _, r := range rep.Throughput {
		if r.MBPerSec <= 0 {
			t.Errorf("implausible row %+v", r)
		}
	}
}

// TestReplicateLiveEndpoints measures two named live endpoints of one
// running node side by side: each gets its rows under its own name, the
// shared-memory one a pinned bulk row, and the raw TCP link is the unit of
// the throughput ratios.
func TestReplicateLiveEndpoints(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("shared memory is Linux only")
	}
	dir := t.TempDir()
	srv, err := hypervisor.NewServer(sim.New(1<<30), hypervisor.DefaultConfig(), prometheus.NewRegistry(),
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	eps := []string{"unix://" + filepath.Join(dir, "g.sock"), "shm+unix://" + filepath.Join(dir, "s.sock")}
	for _, ep := range eps {
		ln, err := transport.Listen(ep)
		if err != nil {
			t.Fatal(err)
		}
		go srv.Serve(ln)
	}
	rep, err := ReplicateLive(ReplicateOptions{BulkBytes: 1 << 20, Rounds: 1, Calls: 5}, "sock="+eps[0]+",ring="+eps[1])
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, r := range rep.Throughput {
		paths = append(paths, r.Path)
		if r.MBPerSec <= 0 {
			t.Errorf("implausible row %+v", r)
		}
	}
	want := "raw tcp link,direct-sim,direct-sim pinned,sock,ring,ring pinned"
	if got := strings.Join(paths, ","); got != want {
		t.Errorf("throughput rows %s, want %s", got, want)
	}
	if rep.Throughput[0].VsTCPCopy != 1 || len(rep.Latency) != 2*3 {
		t.Errorf("report: %+v", rep)
	}
}

// TestStepWaits: a recorded training step waits only for what the program
// waits for (its copies to the host and its synchronisation), over every
// transport: launches and memsets are pipelined.
func TestStepWaits(t *testing.T) {
	rows, err := Step(3)
	if err != nil {
		t.Fatal(err)
	}
	want := float64(resnetStep.reads + resnetStep.syncs)
	for _, r := range rows {
		if r.WaitsPerStep >= 0 && r.WaitsPerStep != want {
			t.Errorf("%s: %.2f requests waited for per step, want %.0f (the step's copies to the host and its synchronisation)", r.Transport, r.WaitsPerStep, want)
		}
	}
	if len(rows) < 3 {
		t.Fatalf("%d transports measured: %+v", len(rows), rows)
	}
}

// BenchmarkStep prints the recorded step's figures per transport.
func BenchmarkStep(b *testing.B) {
	rows, err := Step(max(b.N, 50))
	if err != nil {
		b.Fatal(err)
	}
	PrintStep(os.Stdout, rows)
	for _, r := range rows {
		b.ReportMetric(r.UsPerStep, r.Transport+"_us/step")
		if r.WaitsPerStep >= 0 {
			b.ReportMetric(r.WaitsPerStep, r.Transport+"_waits/step")
		}
	}
}

// TestStepLive: several guests replay the recorded step at once against a
// running node; each waits only for the step's copies to the host and its
// synchronisation.
func TestStepLive(t *testing.T) {
	srv, err := hypervisor.NewServer(sim.New(1<<30), hypervisor.DefaultConfig(), prometheus.NewRegistry(),
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ep := "unix://" + filepath.Join(t.TempDir(), "g.sock")
	ln, err := transport.Listen(ep)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	row, err := StepLive(ep, 3, 4)
	if err != nil {
		t.Fatal(err)
	}
	if want := float64(resnetStep.reads + resnetStep.syncs); row.WaitsPerStep != want || row.StepsPerSec <= 0 || row.Transport != "unix x3" {
		t.Fatalf("row %+v, want %.0f waits a step from 3 unix guests", row, want)
	}
	if _, err := StepLive(ep, 0, 4); err == nil {
		t.Fatal("no guests: no error")
	}
}
