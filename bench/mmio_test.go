package bench

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vgpuha/vgpuha/internal/mmioguest"
)

// The MMIO benchmark's guest is this test binary (a separate process, as
// tracing requires), started with mmioGuestEnv set.
const mmioGuestEnv = "VGPUHA_BENCH_MMIO_GUEST"

func TestMain(m *testing.M) {
	if os.Getenv(mmioGuestEnv) != "" {
		if err := mmioguest.Main(flag.NewFlagSet("mmio-guest", flag.ContinueOnError), os.Args[1:], os.Stdout); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestMMIORuns runs a small benchmark: every cell must report figures and,
// where writes are traced, a device copy equal to the guest's memory.
func TestMMIORuns(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts and traces guest processes")
	}
	t.Setenv(mmioGuestEnv, "1")
	opts := DefaultMMIOOptions([]string{os.Args[0]}, false)
	opts.Rounds = 1
	opts.ApertureBytes = 256 << 10
	opts.Writes = map[string]int{"seq": 2000, "random": 2000, "bulk": 1 << 16, "doorbell": 500}
	cells, err := MMIO(opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(cells) != len(opts.Workloads)*(len(opts.Modes)-2)+2 {
		t.Fatalf("%d cells", len(cells))
	}
	for _, c := range cells {
		if c.NsPerWrite <= 0 || c.Writes == 0 || c.Verified != (c.Mode != "off") {
			t.Errorf("%+v", c)
		}
		if strings.HasPrefix(c.Mode, "insn") && c.Workload == "seq" && c.FaultsPerWrite != 1 {
			t.Errorf("insn seq: %v faults per write, want 1", c.FaultsPerWrite)
		}
		// Every fault the tracer handled is a fault the kernel took: the
		// eBPF count, where it runs, can never be lower.
		if c.KernelFaultsPerWrite >= 0 && c.KernelFaultsPerWrite < c.FaultsPerWrite {
			t.Errorf("%s/%s: the kernel counted %.3f write faults per write, the tracer handled %.3f",
				c.Mode, c.Workload, c.KernelFaultsPerWrite, c.FaultsPerWrite)
		}
	}
	if err := PlotMMIO(filepath.Join(t.TempDir(), "mmio.svg"), cells); err != nil {
		t.Fatal(err)
	}
	var table strings.Builder
	PrintMMIO(&table, cells)
	t.Log("\n" + table.String())
}
