package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vgpuha/vgpuha/internal/lab/mmioguest"
)

// The MMIO benchmark's guest is this test binary (a separate process, as
// tracing requires), started with mmioGuestEnv set.
const mmioGuestEnv = "VGPUHA_BENCH_MMIO_GUEST"

func TestMain(m *testing.M) {
	if os.Getenv(mmioGuestEnv) != "" {
		if err := mmioguest.MainArgs(os.Args[1:], os.Stdout); err != nil {
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
	opts.Workloads = []string{"seq", "random", "bulk", "doorbell", "threads:16"}
	opts.Writes = map[string]int{"seq": 2000, "random": 2000, "bulk": 1 << 16, "doorbell": 500, "threads": 4 * 50000}
	opts.InsnWrites = 4000
	var progress strings.Builder
	opts.Progress = &progress
	cells, err := MMIO(opts)
	if err != nil {
		t.Fatal(err)
	}
	variants := 0 // insn-step, insn-unpinned: seq only
	for _, m := range opts.Modes {
		if strings.Contains(m, "-") {
			variants++
		}
	}
	if len(cells) != len(opts.Workloads)*(len(opts.Modes)-variants)+variants {
		t.Fatalf("%d cells", len(cells))
	}
	// Not a terminal: one line per cell, never a carriage return.
	if strings.Contains(progress.String(), "\r") || strings.Count(progress.String(), "\n") != len(cells) {
		t.Errorf("progress:\n%q", progress.String())
	}
	for _, c := range cells {
		if c.Workload == "threads" && (c.Threads != 4 || c.Pages != 16) {
			t.Errorf("threads cell: %+v", c)
		}
		if c.Mode == "insn" && c.Writes > uint64(opts.InsnWrites)+64<<10/8 { // bulk copies whole 64 KiB blocks

			t.Errorf("insn cell over the cap: %+v", c)
		}
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
