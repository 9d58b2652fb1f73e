package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/internal/lab/cluster"
	"github.com/vgpuha/vgpuha/mmiotrace"
	"github.com/vgpuha/vgpuha/replicate"
)

// tortureCases are the MMIO torture guest's cases (mmiotrace's
// testdata/cguest), run here as a CUDA program whose aperture a node
// traces. want is what the guest must say, where the case reports an
// outcome: a bypass fails at the call (EPERM), a forked child's store
// kills the child, the guest's own SIGSEGV handler runs.
var tortureCases = []struct{ cmd, want string }{
	{"run forms", ""}, {"run fallback", ""}, {"run torture", ""}, {"run movs", ""}, {"run guestrw", ""},
	{"run altstack", "result altstack 1"}, {"run odirect 4", ""}, {"run pread 40 1", ""}, {"run pread 20 0", ""},
	{"bypass pwrite", "result pwrite -1 1"}, {"bypass punch", "result punch -1 1"}, {"bypass remove", "result remove -1 1"},
	{"bypass reopen", "result reopen -1 1"}, {"bypass mmap", "result mmap -1 1"}, {"bypass fork", "result fork signaled 11"},
	{"run guestro jump", "result guestro jump 20488 11"}, {"run guestro fix", "result guestro fix 20488 77"},
	{"run forms", ""},
}

// TestApertureTorture runs every torture case against a primary that
// traces the program's aperture and replicates it to a standby, in each
// tracing mode, and after each case `verify --apertures`: the aperture's
// file (what the program's memory holds) must equal the device copy on
// the primary and on the standby, byte for byte. Untraced (off), the
// first case's stores must show up as lost.
func TestApertureTorture(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: builds libcuda.so.1, traces a C program")
	}
	dir := build(t)
	guest := filepath.Join(dir, "stores")
	if out, err := exec.Command("gcc", "-O2", "-Wall", "-o", guest, filepath.Join("..", "..", "mmiotrace", "testdata", "cguest", "stores.c")).CombinedOutput(); err != nil {
		t.Fatalf("building the torture guest: %v\n%s", err, out)
	}
	for _, mode := range []mmiotrace.Mode{mmiotrace.ModeOff, mmiotrace.ModeInsn, mmiotrace.ModePage, mmiotrace.ModeUffd} {
		t.Run(mode.String(), func(t *testing.T) {
			if mode == mmiotrace.ModeUffd && mmiotrace.UffdAvailable() != nil {
				t.Skipf("uffd mode needs userfaultfd asynchronous write-protection (Linux 6.7+): %v", mmiotrace.UffdAvailable())
			}
			tortureUnderNode(t, guest, dir, mode)
		})
	}
}

func tortureUnderNode(t *testing.T, guest, libDir string, mode mmiotrace.Mode) {
	c, err := cluster.Start(cluster.Options{Replicate: true, StartStandby: true, Mode: replicate.ModeCommit,
		MMIO: &hypervisor.MMIOConfig{Mode: mode, Pin: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cmd := mmiotrace.GuestCommand(exec.Command(guest))
	cmd.Dir = t.TempDir() // the O_DIRECT case's file
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+libDir, "VGPUHA_ENDPOINT="+c.Endpoint)
	cmd.Stderr = os.Stderr
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ended := false
	defer func() {
		if !ended {
			in.Close()
			mmiotrace.WaitExit(cmd)
		}
	}()
	sc := bufio.NewScanner(out)
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "fd=") {
		cmd.Process.Kill()
		t.Fatalf("guest said %q", sc.Text())
	}
	for _, tc := range tortureCases {
		said := tortureStep(t, in, sc, tc.cmd)
		if tc.want != "" && said != tc.want {
			t.Errorf("%s %s: guest said %q, want %q", mode, tc.cmd, said, tc.want)
		}
		rep, err := c.Verify()
		if mode == mmiotrace.ModeOff { // nothing traced: the check must see the program's stores missing
			if err != nil || rep.Match || len(rep.Apertures) != 1 || rep.Apertures[0].Primary.Match() {
				t.Fatalf("off %s: verify --apertures found no lost write: %v %+v", tc.cmd, err, rep)
			}
			return
		}
		if err != nil || !rep.Match || len(rep.Apertures) != 1 {
			t.Fatalf("%s %s: verify --apertures: %v %+v", mode, tc.cmd, err, rep)
		}
		t.Logf("torture case %s %q under a node: guest said %q; verify --apertures: %d bytes, primary and standby match",
			mode, tc.cmd, said, rep.Apertures[0].Size)
	}
	ended = true
	in.Close() // the guest exits on end of input, cleanly
	if err := mmiotrace.WaitExit(cmd); err != nil {
		t.Errorf("%s: the guest did not exit cleanly after the last case: %v", mode, err)
	}
}

// tortureStep sends one command and returns what the guest said for it
// (its "result" lines), once it is done.
func tortureStep(t *testing.T, in io.Writer, sc *bufio.Scanner, cmd string) string {
	t.Helper()
	fmt.Fprintln(in, cmd)
	var said []string
	deadline := time.AfterFunc(time.Minute, func() { t.Errorf("%s: no answer in a minute", cmd) })
	defer deadline.Stop()
	for sc.Scan() {
		switch line := sc.Text(); {
		case line == "done":
			return strings.Join(said, ";")
		case strings.HasPrefix(line, "result "), strings.HasPrefix(line, "error"):
			said = append(said, line)
		}
	}
	t.Fatalf("%s: the guest ended (%v)", cmd, sc.Err())
	return ""
}
