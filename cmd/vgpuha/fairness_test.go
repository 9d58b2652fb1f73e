package main

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"testing"

	"github.com/vgpuha/vgpuha/bench"
)

// TestBenchFairness: `bench fairness` runs a pair per share, its busy
// guests as processes of their own, and reports every load for each share
// with figures (issue 47's fairness row); a speed is never asserted.
func TestBenchFairness(t *testing.T) {
	skipShort(t)
	out, err := exec.Command(labBin, "bench", "fairness", "--backend", "sim", "--shares", "off,256KiB", "--rounds", "1",
		"--calls", "20", "--heavy-bytes", "1MiB", "--json").Output()
	if err != nil {
		t.Fatalf("bench fairness: %v\n%s", err, out)
	}
	var rows []bench.FairnessRow
	if err := json.Unmarshal(out, &rows); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	seen := map[string]bool{}
	for _, r := range rows {
		if r.Calls != 20 || r.P50us <= 0 || r.P99us < r.P50us || r.VsIdleP99 <= 0 {
			t.Errorf("row without sane figures: %+v", r)
		}
		seen[fmt.Sprint(r.Share, "/", r.Load)] = true
	}
	for _, share := range []int64{0, 256 << 10} {
		for _, load := range []string{"idle", "1 reader", "1 writer", "1 reader, other pair", "1 writer, other pair"} {
			if !seen[fmt.Sprint(share, "/", load)] {
				t.Errorf("no row for share %d, %s: %s", share, load, out)
			}
		}
	}
}
