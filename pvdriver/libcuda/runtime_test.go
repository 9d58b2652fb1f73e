package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/internal/lab/cluster"
	"github.com/vgpuha/vgpuha/pvdriver/cuapi"
	"github.com/vgpuha/vgpuha/replicate"
)

// TestRuntimeView runs testdata/runtime_view.c against a replicated primary
// on the software GPU: every name and version PyTorch 2.11's CUDA runtime
// looks up (testdata/runtime/cudart13-procs.txt) resolves, the export
// tables answer, and the integrity answers are the ones this test
// recomputes from the inputs the program prints (the runtime refuses a
// driver whose answer differs from its own computation).
func TestRuntimeView(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: builds libcuda.so.1 and a C program")
	}
	dir := build(t)
	bin := filepath.Join(dir, "runtime_view")
	if out, err := exec.Command("gcc", "-O2", "-Wall", "-Werror", "-o", bin, filepath.Join("testdata", "runtime_view.c"),
		"-L"+dir, "-lcuda", "-lpthread").CombinedOutput(); err != nil {
		t.Fatalf("building runtime_view: %v\n%s", err, out)
	}
	ptx := kernelDir(t)
	c := protectedPair(t, cluster.Options{Replicate: true, StartStandby: true, Mode: replicate.ModeCommit})
	procs, err := os.Open(filepath.Join("testdata", "runtime", "cudart13-procs.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer procs.Close()
	cmd := exec.Command(bin, ptx)
	cmd.Stdin = procs
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+dir, "VGPUHA_ENDPOINT="+c.Endpoint)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("runtime_view: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr.String())
	}
	checkIntegrity(t, string(out))
	t.Logf("runtime_view:\n%s", out)
	if !strings.Contains(string(out), "runtime_view ok") {
		t.Fatalf("runtime_view did not finish:\n%s", out)
	}
}

// checkIntegrity recomputes the three integrity answers from the inputs
// the program printed.
func checkIntegrity(t *testing.T, out string) {
	t.Helper()
	var in cuapi.IntegrityInput
	var dev cuapi.DeviceIdentity
	got := map[uint32]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 27 && f[0] == "integrity-input":
			n := make([]uint64, len(f)-1)
			for i, s := range f[1:] {
				v, err := strconv.ParseUint(s, 10, 64)
				if err != nil {
					t.Fatalf("integrity input %q: %v", s, err)
				}
				n[i] = v
			}
			in = cuapi.IntegrityInput{DriverVersion: uint32(n[0]), Process: uint32(n[1]), Thread: uint32(n[2]),
				RuntimeTable: n[3], IntegrityTable: n[4], CheckFunc: n[5], UnixSeconds: n[6]}
			for i := range dev.UUID {
				dev.UUID[i] = byte(n[7+i])
			}
			dev.PCIDomain, dev.Bus, dev.Slot = int32(n[23]), int32(n[24]), int32(n[25])
		case len(f) == 4 && f[0] == "integrity":
			v, _ := strconv.ParseUint(f[1], 10, 32)
			got[uint32(v)] = f[2] + f[3]
		}
	}
	if in.Process == 0 || len(got) != 3 {
		t.Fatalf("no integrity inputs or answers in the output:\n%s", out)
	}
	for version, answer := range got {
		in.RuntimeVersion = version
		a := cuapi.IntegrityAnswer(in, []cuapi.DeviceIdentity{dev})
		want := fmt.Sprintf("%016x%016x", leU64(a[:8]), leU64(a[8:]))
		if answer != want {
			t.Errorf("integrity answer for runtime %d: %s, recomputed %s", version, answer, want)
		}
	}
}

func leU64(b []byte) uint64 {
	var v uint64
	for i := 7; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v
}

// TestProgramsBackToBack runs the vadd program 20 times, each started as
// the last one exits, against a replicated primary that serves one guest
// at a time (--guest.max-sessions 1, as guest-built kernels require): the
// library's exit frees the session's slot before the process is gone.
func TestProgramsBackToBack(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: builds libcuda.so.1 and runs a C program 20 times")
	}
	dir := build(t)
	ptx := kernelDir(t)
	c := protectedPair(t, cluster.Options{Replicate: true, StartStandby: true, Mode: replicate.ModeCommit, OneGuestPerProcess: true})
	start := time.Now()
	for i := 0; i < 20; i++ {
		cmd := exec.Command(filepath.Join(dir, "vadd"), ptx)
		cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+dir, "VGPUHA_ENDPOINT="+c.Endpoint, "VGTEST_SIM=1",
			"VGPUHA_FAILOVER="+c.StandbyEndpoint) // a session a failover could resume is kept for a grace unless closed
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), " ok") {
			t.Fatalf("program %d of 20: %v\n%s", i+1, err, out)
		}
	}
	t.Logf("20 programs back to back in %v", time.Since(start).Round(time.Millisecond))
}
