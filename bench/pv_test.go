package bench

import (
	"runtime"
	"testing"
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
	if len(rows) != 3*transports+pinned {
		t.Fatalf("got %d rows, want 3 ops x %d transports and %d pinned bulk copies", len(rows), transports, pinned)
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
