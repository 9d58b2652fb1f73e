package bench

import (
	"testing"
)

// TestPVRuns checks the harness end to end on a tiny run: every
// configuration is measured and the direct row is the unit of the ratios.
// It asserts nothing about speed.
func TestPVRuns(t *testing.T) {
	rows, err := PV(PVOptions{Rounds: 1, Batch: 20})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 6 {
		t.Fatalf("got %d rows, want 2 ops x 3 transports", len(rows))
	}
	for _, r := range rows {
		if r.NsPerOp <= 0 || (r.Transport == "direct" && r.VsDirect != 1) {
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
