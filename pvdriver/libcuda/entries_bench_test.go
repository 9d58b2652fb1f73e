package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/vgpuha/vgpuha/internal/lab/cluster"
)

// BenchmarkEntries is what a call into the library costs the calling
// thread, per kind of entry (testdata/entries.c, against an unreplicated
// primary on the software GPU over a unix socket): a query answered from
// the answers the library keeps in C (ctx_get_device, func_get_attribute),
// one that enters Go (ctx_get_current), a launch (a pipelined request), a
// 4-byte copy to the host (a round trip) and a 3 MiB one (an evaluation
// step's outputs read back). Each is reported as ns per
// call; the first two against the third is what answers.c saves a call.
func BenchmarkEntries(b *testing.B) {
	dir := build(b)
	bin := filepath.Join(dir, "entries")
	if out, err := exec.Command("gcc", "-O2", "-Wall", "-Werror", "-o", bin, filepath.Join("testdata", "entries.c"),
		"-L"+dir, "-lcuda").CombinedOutput(); err != nil {
		b.Fatalf("building entries: %v\n%s", err, out)
	}
	c, err := cluster.Start(cluster.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	ptx := kernelDir(b)
	var last string
	for b.Loop() {
		cmd := exec.Command(bin, ptx, "1")
		cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+dir, "VGPUHA_ENDPOINT="+c.Endpoint)
		out, err := cmd.CombinedOutput()
		if err != nil {
			b.Fatalf("entries: %v\n%s", err, out)
		}
		last = string(out)
	}
	for _, line := range strings.Split(strings.TrimSpace(last), "\n") {
		name, ns, ok := strings.Cut(line, " ")
		v, err := strconv.ParseFloat(ns, 64)
		if !ok || err != nil {
			b.Fatalf("entries printed %q", line)
		}
		b.ReportMetric(v, "ns/"+name)
	}
}
