//go:build linux

package kmod

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/internal/lab/vmtest"
)

// TestModuleInVM builds the module for the VM's kernel, boots the VM with
// it and this package's tests, and runs the TestInVM tests there (the
// store sequence, page mode, refusals, the eBPF counter beside the
// module's count, a hostile process for VGPUHA_KMOD_HOSTILE, default 20s);
// then the module must unload, its slab caches and counters must be
// empty, and dmesg must hold no oops or warning.
func TestModuleInVM(t *testing.T) {
	if err := vmtest.Available(); err != nil {
		t.Skip(err)
	}
	if _, err := vmtest.KernelBuild(); err != nil {
		t.Skip(err)
	}
	hostile := os.Getenv("VGPUHA_KMOD_HOSTILE")
	if hostile == "" {
		hostile = "20s"
	}
	d, err := time.ParseDuration(hostile)
	if err != nil {
		t.Fatalf("VGPUHA_KMOD_HOSTILE: %v", err)
	}
	files := vmFiles(t)
	bench := "echo 'bench mmio: skipped (set VGPUHA_KMOD_BENCH=1, as make kmod-test does)'"
	timeout := 10*time.Minute + 2*d
	if os.Getenv("VGPUHA_KMOD_BENCH") != "" {
		timeout += 25 * time.Minute
		bench = "/vgpuha bench mmio --rounds 3 --insn-writes 2000 --workloads seq,random,bulk,doorbell --modes off,page,kmod-page,kmod-auto,kmod,insn || exit 5"
	}
	cmd := "VGPUHA_KMOD_HOSTILE=" + hostile + " /kmod.test -test.run '^TestInVM' -test.v -test.count=1 &&\n" +
		"/mmioguest.test -test.run '^TestReplicaAperturesEqual$/^kmod' -test.v -test.count=1 &&\n" +
		"MMIOTRACE_CGUEST=/cguest /mmiotrace.test -test.run '^(TestTraceModes|TestStoreForms)$/^kmod' -test.v -test.count=1 &&\n" + bench
	if c := os.Getenv("VGPUHA_KMOD_SCRIPT"); c != "" {
		cmd = c // instead, to try something in the VM (the binaries are at /kmod.test, /vgpuha...)
	}
	res, err := vmtest.Run(vmtest.Config{
		Files:   files,
		Script:  InVMScript("/vgpuha_mmio.ko", cmd),
		Append:  "slab_nomerge oops=panic",
		Timeout: timeout,
	})
	t.Log(res.Output)
	if err != nil {
		t.Fatalf("%v\n%s", err, res.Console)
	}
	if res.ExitCode != 0 {
		t.Fatalf("VM script exited %d", res.ExitCode)
	}
	for _, want := range []string{"RMMOD-OK", "SLAB-EMPTY", "DMESG-CLEAN"} {
		if !strings.Contains(res.Output, want) {
			t.Errorf("the VM did not report %s", want)
		}
	}
}

// InVMScript is the VM script that loads the module at ko, runs cmd, and
// checks that the module leaves nothing behind: its slab caches empty
// (boot with slab_nomerge), rmmod works, dmesg holds no oops or warning.
func InVMScript(ko, cmd string) string {
	return `ip link set lo up
insmod ` + ko + ` || exit 3
` + cmd + ` || exit 1
cat /sys/class/misc/vgpuha_mmio/stats
for c in /sys/kernel/slab/vgpuha_*; do echo 1 > $c/shrink; done
grep -E '^vgpuha_' /proc/slabinfo | awk '{print "slab", $1, "active", $2} $2 != 0 {bad=1} END {if (!bad) print "SLAB-EMPTY"}'
rmmod vgpuha_mmio && echo RMMOD-OK
if dmesg | grep -v 'ommand line' | grep -iE 'oops|warning|bug:|call trace|general protection|refcount_t'; then echo DMESG-BAD; exit 4; fi
echo DMESG-CLEAN`
}

// vmFiles builds what the VM needs: the module, the test binaries
// (static), the C guest (static), vgpuha and the libraries it links.
func vmFiles(t *testing.T) map[string]string {
	t.Helper()
	src, err := filepath.Abs("module")
	if err != nil {
		t.Fatal(err)
	}
	ko, err := vmtest.BuildModule(src, "vgpuha_mmio")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	files := map[string]string{"/vgpuha_mmio.ko": ko}
	for dst, pkg := range map[string]string{"/kmod.test": ".", "/mmioguest.test": "../internal/lab/mmioguest", "/mmiotrace.test": "../mmiotrace"} {
		files[dst] = filepath.Join(tmp, filepath.Base(dst))
		if err := vmtest.BuildTest(pkg, files[dst]); err != nil {
			t.Fatal(err)
		}
	}
	files["/cguest"] = filepath.Join(tmp, "cguest")
	if out, err := exec.Command("gcc", "-static", "-O2", "-o", files["/cguest"], "../mmiotrace/testdata/cguest/stores.c").CombinedOutput(); err != nil {
		t.Fatalf("building the C guest for the VM: %v\n%s", err, out)
	}
	files["/vgpuha"] = filepath.Join(tmp, "vgpuha")
	build := exec.Command("go", "build", "-o", files["/vgpuha"], "../cmd/vgpuha-lab") // bench mmio and its mmio-guest are the lab tool's
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building vgpuha for the VM: %v\n%s", err, out)
	}
	return files // vmtest.Run adds the libraries purego links it to
}
