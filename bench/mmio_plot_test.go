package bench

import (
	"path/filepath"
	"testing"
)

func TestPlotMMIO(t *testing.T) {
	cells := []MMIOCell{
		{Mode: "off", Workload: "seq", NsPerWrite: 6}, {Mode: "insn", Workload: "seq", NsPerWrite: 9500},
		{Mode: "off", Workload: "bulk", NsPerWrite: 0.4}, {Mode: "insn", Workload: "bulk", NsPerWrite: 11},
	}
	for _, name := range []string{"mmio.png", "mmio.svg"} {
		if err := PlotMMIO(filepath.Join(t.TempDir(), name), cells); err != nil {
			t.Fatal(err)
		}
	}
}
