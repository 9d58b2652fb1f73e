package main

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/internal/lab/cluster"
	"github.com/vgpuha/vgpuha/replicate"
)

// programs are the C test programs in testdata, each written against
// NVIDIA's driver API (testdata/cudaapi.h declares the subset) and run
// unchanged through the library.
var programs = []string{"vadd", "matmul", "pipeline", "attributes", "modfile", "procaddr", "errors", "surfaces", "graph", "graphbuild", "vmm", "sigstack", "bigimage", "answers"}

// ownCode are the programs that load machine code of their own (a fatbin),
// which a node runs only with a primary per guest.
var ownCode = map[string]bool{"bigimage": true}

// build compiles the library and the programs into a temporary directory.
func build(t testing.TB) string {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc is missing (apt-get install gcc): the C test programs cannot be built")
	}
	dir := t.TempDir()
	start := time.Now()
	out, err := exec.Command("go", "build", "-buildmode=c-shared", "-ldflags=-extldflags=-Wl,-soname,libcuda.so.1",
		"-o", filepath.Join(dir, "libcuda.so.1"), ".").CombinedOutput()
	if err != nil {
		t.Fatalf("building libcuda.so.1: %v\n%s", err, out)
	}
	if err := os.Symlink("libcuda.so.1", filepath.Join(dir, "libcuda.so")); err != nil {
		t.Fatal(err)
	}
	checkDlsymNames(t, filepath.Join(dir, "libcuda.so.1"))
	checkDlopen(t, dir)
	for _, p := range programs {
		out, err := exec.Command("gcc", "-O2", "-Wall", "-Werror", "-ffp-contract=off", "-o", filepath.Join(dir, p),
			filepath.Join("testdata", p+".c"), "-L"+dir, "-lcuda").CombinedOutput()
		if err != nil {
			t.Fatalf("building %s: %v\n%s", p, err, out)
		}
	}
	t.Logf("built libcuda.so.1 and %d programs in %v", len(programs), time.Since(start).Round(time.Millisecond))
	return dir
}

// TestPrograms runs every C program through the library against a primary
// on the software GPU replicated to a standby (commit mode), over unix
// sockets, TCP and shared memory (where cuMemAllocHost's memory is the
// session's host-memory region): once checking at the program's checkpoint that the
// standby's copy verifies identical, once SIGKILL-like failing the primary
// there. Each program must finish with correct results and exit code 0.
func TestPrograms(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: builds libcuda.so.1 and the C programs, runs each against replicated primaries")
	}
	dir := build(t)
	ptx := kernelDir(t)
	for _, transport := range []string{"unix", "tcp", "shm+unix"} {
		for _, kill := range []bool{false, true} {
			for _, p := range programs {
				name := fmt.Sprintf("%s/%s/%s", transport, map[bool]string{false: "verify", true: "failover"}[kill], p)
				t.Run(name, func(t *testing.T) {
					runProgram(t, filepath.Join(dir, p), dir, ptx, transport, kill)
				})
			}
		}
	}
}

func runProgram(t *testing.T, bin, libDir, ptx, transport string, kill bool) {
	// The standby watches the primary only where the test kills it: a
	// verify run on a loaded machine (a 25 MB image uploaded for half a
	// minute under the race detector) once lost the primary's heartbeats
	// long enough to take over.
	opts := cluster.Options{Replicate: true, StartStandby: true, Failover: kill, Mode: replicate.ModeCommit,
		OneGuestPerProcess: ownCode[filepath.Base(bin)]}
	if ownCode[filepath.Base(bin)] {
		// bigimage uploads 25 MB, for half a minute under the race
		// detector on a loaded machine, where the primary's heartbeats
		// once missed the default 270 ms and the standby took over
		// before the checkpoint. Detection time is the drills' to
		// measure; here the kill is found after 2 s.
		opts.FailoverAfter = 2 * time.Second
	}
	switch transport {
	case "tcp":
		opts.GuestTCP = true
	case "shm+unix":
		opts.GuestScheme = transport
	}
	c := protectedPair(t, opts)
	cmd := exec.Command(bin, ptx)
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+libDir, "VGPUHA_ENDPOINT="+c.Endpoint,
		"VGPUHA_FAILOVER="+c.StandbyEndpoint, "VGTEST_CHECKPOINT=1", "VGTEST_SIM=1", "VGPUHA_DEBUG=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var last string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if line := sc.Text(); line != "checkpoint" {
			last = line
			continue
		}
		rep, err := c.Verify()
		if err != nil || !rep.Match || rep.Objects == 0 {
			t.Errorf("verify at the checkpoint: %+v, %v", rep, err)
		}
		if kill {
			c.KillPrimary()
		}
		stdin.Write([]byte("\n"))
	}
	err = cmd.Wait()
	if err != nil || !strings.Contains(last, " ok") {
		t.Fatalf("%s: %v; last line %q\nstderr:\n%s", filepath.Base(bin), err, last, stderr.String())
	}
	if kill && c.Standby.Promoted() == nil {
		t.Fatal("the program finished, but the standby was never promoted: it did not run there")
	}
	_, report, said := strings.Cut(stderr.String(), "\nfailover 1: ")
	if said != kill {
		t.Errorf("%s: the exit report names a failover: %v, want %v:\n%s", filepath.Base(bin), said, kill, stderr.String())
	}
	if said {
		t.Logf("%s: failover 1: %s", filepath.Base(bin), strings.SplitN(report, "\n", 2)[0])
	}
	checkTally(t, filepath.Base(bin), stderr.String())
	t.Logf("%s in %v", last, time.Since(start).Round(time.Millisecond))
}

// checkDlopen checks a program can open the library with dlopen, as
// frameworks do (testdata/dlopen.c).
func checkDlopen(t testing.TB, dir string) {
	t.Helper()
	bin := filepath.Join(dir, "dlopen")
	if out, err := exec.Command("gcc", "-O2", "-Wall", "-o", bin, filepath.Join("testdata", "dlopen.c"), "-ldl").CombinedOutput(); err != nil {
		t.Fatalf("building dlopen: %v\n%s", err, out)
	}
	if out, err := exec.Command(bin, filepath.Join(dir, "libcuda.so.1")).CombinedOutput(); err != nil {
		t.Fatalf("dlopen of the library: %v\n%s", err, out)
	}
}

// checkTally checks the entry tally a program's stderr ends with (VGPUHA_DEBUG
// turns it on): vadd launches its kernel once through cuLaunchKernel.
func checkTally(t *testing.T, prog, stderr string) {
	t.Helper()
	_, tally, ok := strings.Cut(stderr, "calls into the library, per entry")
	if !ok {
		t.Fatalf("%s: no entry tally at exit:\n%s", prog, stderr)
	}
	if prog != "vadd" {
		return
	}
	t.Logf("vadd's entry tally:%s", tally)
	for _, line := range strings.Split(tally, "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "vgLaunchKernel" {
			if f[1] != "1" {
				t.Errorf("vadd: the tally counts %s calls of vgLaunchKernel, want 1:\n%s", f[1], tally)
			}
			return
		}
	}
	t.Errorf("vadd: the tally has no vgLaunchKernel line:\n%s", tally)
}

// kernelDir is the kernel library's PTX, which the C programs load.
func kernelDir(t testing.TB) string {
	t.Helper()
	ptx, err := filepath.Abs(filepath.Join("..", "..", "kernels", "ptx"))
	if err != nil {
		t.Fatal(err)
	}
	return ptx
}

// protectedPair starts a primary and its standby on the software GPU and
// waits until the standby protects the primary; the test closes them.
func protectedPair(t testing.TB, opts cluster.Options) *cluster.Cluster {
	t.Helper()
	c, err := cluster.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if err := c.WaitProtected(time.Minute); err != nil {
		t.Fatal(err)
	}
	return c
}

// checkDlsymNames fails t unless the library at path exports every name of
// testdata/dlsym_names.txt: host libraries bind those with dlsym, and one
// missing fails its caller with no refused call to name.
func checkDlsymNames(t testing.TB, path string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF && elf.ST_TYPE(s.Info) == elf.STT_FUNC {
			exported[s.Name] = true
		}
	}
	list, err := os.ReadFile(filepath.Join("testdata", "dlsym_names.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(list), "\n") {
		if name := strings.TrimSpace(line); name != "" && !strings.HasPrefix(name, "#") && !exported[name] {
			t.Errorf("libcuda.so.1 does not export %s, which host libraries bind with dlsym", name)
		}
	}
}
