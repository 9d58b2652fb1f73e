// Package vmtest boots a Debian kernel under qemu with a tiny initramfs
// (busybox, chosen kernel modules, static test binaries) and returns what
// the VM printed on its serial console. It is how vgpuha tests what this
// machine's kernel will not let it do: AF_VSOCK and loading kernel modules.
//
// The kernel and modules come from scripts/setup-test-deps.sh, which
// unpacks Debian's linux-image package into .vm/ at the repository root.
// Where qemu, busybox or the kernel is missing, or the tests run with
// -short (a boot takes seconds), Available says so and tests skip with
// that message. It is test scaffolding: no product package imports it.
package vmtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

const busybox = "/bin/busybox"

// Dir returns the .vm directory of the repository holding the caller's
// working directory.
func Dir() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return filepath.Join(d, ".vm"), nil
		}
		if filepath.Dir(d) == d {
			return "", errors.New("vmtest: no go.mod above the working directory")
		}
	}
}

// Available returns nil if a VM can be booted, or why not, with the fix.
func Available() error {
	if testing.Testing() && testing.Short() {
		return errors.New("slow: booting a VM takes seconds (skipped under -short)")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		return errors.New("qemu-system-x86_64 not installed (run scripts/setup-test-deps.sh, or apt-get install qemu-system-x86)")
	}
	if _, err := exec.LookPath("cpio"); err != nil {
		return errors.New("cpio not installed (apt-get install cpio)")
	}
	if out, err := exec.Command(busybox, "--help").CombinedOutput(); err != nil || !bytes.Contains(out, []byte("BusyBox")) {
		return errors.New("static busybox not installed at /bin/busybox (apt-get install busybox-static)")
	}
	dir, err := Dir()
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(dir, "vmlinuz")); err != nil {
		return fmt.Errorf("no kernel at %s/vmlinuz (run scripts/setup-test-deps.sh)", dir)
	}
	return nil
}

// Config describes one VM run.
type Config struct {
	// Modules are loaded with insmod in order; paths are relative to the
	// kernel's module tree, e.g. "kernel/net/vmw_vsock/vsock.ko".
	Modules []string
	// Files are copied into the initramfs: destination path -> host path.
	Files map[string]string
	// Script is run by /init after the modules are loaded.
	Script string
	// Timeout bounds the whole boot; software emulation is slow.
	Timeout time.Duration
	// Append is added to the kernel command line.
	Append string
}

// Result is what the VM reported.
type Result struct {
	Console  string // everything on the serial console
	Output   string // what Script printed
	ExitCode int    // Script's exit status
}

var exitRE = regexp.MustCompile(`VMTEST-EXIT=(\d+)`)

// Run boots the VM, runs cfg.Script, and returns its output.
func Run(cfg Config) (Result, error) {
	if err := Available(); err != nil {
		return Result{}, err
	}
	dir, _ := Dir()
	work, err := os.MkdirTemp("", "vmtest")
	if err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(work)
	root := filepath.Join(work, "root")
	for _, d := range []string{"bin", "sbin", "proc", "sys", "dev", "tmp", "modules"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return Result{}, err
		}
	}
	files := map[string]string{"/bin/busybox": busybox}
	for i, m := range cfg.Modules {
		files[fmt.Sprintf("/modules/%02d-%s", i, filepath.Base(m))] = filepath.Join(dir, "modules", m)
	}
	for dst, src := range cfg.Files {
		files[dst] = src
		// A Go binary that links purego (the CUDA backend, through the
		// node) is dynamic even without cgo: its loader and libc go too.
		libs, err := SharedLibs(src)
		if err != nil {
			return Result{}, err
		}
		for lib := range libs {
			files[lib] = lib
		}
	}
	for dst, src := range files {
		if err := copyFile(filepath.Join(root, dst), src); err != nil {
			return Result{}, err
		}
	}
	init := "#!/bin/busybox sh\n/bin/busybox --install -s /bin\n" +
		"mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev\n" +
		"for m in /modules/*.ko; do insmod $m || echo \"insmod $m failed\"; done\n" +
		"echo VMTEST-BEGIN\n(\n" + cfg.Script + "\n)\necho VMTEST-EXIT=$?\npoweroff -f\n"
	if err := os.WriteFile(filepath.Join(root, "init"), []byte(init), 0o755); err != nil {
		return Result{}, err
	}
	initrd := filepath.Join(work, "initrd.cpio")
	pack := exec.Command("sh", "-c", "find . | cpio -o -H newc --quiet > "+initrd)
	pack.Dir = root
	if out, err := pack.CombinedOutput(); err != nil {
		return Result{}, fmt.Errorf("packing initramfs: %v: %s", err, out)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 3 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", "-M", "q35", "-m", "1024", "-smp", "1",
		"-nographic", "-no-reboot", "-net", "none", "-accel", "tcg",
		"-kernel", filepath.Join(dir, "vmlinuz"), "-initrd", initrd,
		"-append", strings.TrimSpace("console=ttyS0 quiet panic=-1 "+cfg.Append))
	var console bytes.Buffer
	cmd.Stdout, cmd.Stderr = &console, &console
	err = cmd.Run()
	res := Result{Console: console.String(), ExitCode: -1}
	if ctx.Err() != nil {
		return res, fmt.Errorf("VM did not power off within %v", cfg.Timeout)
	}
	if err != nil {
		return res, fmt.Errorf("qemu: %v", err)
	}
	out := res.Console
	if i := strings.Index(out, "VMTEST-BEGIN"); i >= 0 {
		out = out[i+len("VMTEST-BEGIN"):]
	}
	if m := exitRE.FindStringSubmatch(out); m != nil {
		res.ExitCode, _ = strconv.Atoi(m[1])
		out = out[:strings.Index(out, m[0])]
	} else {
		return res, errors.New("VM script never reported its exit status")
	}
	res.Output = strings.ReplaceAll(out, "\r\n", "\n")
	return res, nil
}

// BuildTest compiles the test binary of package pkg (an import path or
// ./dir) statically, for the VM.
func BuildTest(pkg, out string) error {
	cmd := exec.Command("go", "test", "-c", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building %s for the VM: %v\n%s", pkg, err, b)
	}
	return nil
}

// KernelBuild returns the kbuild tree of the VM's kernel (Debian's headers
// package, unpacked by scripts/setup-test-deps.sh), or why there is none.
func KernelBuild() (string, error) {
	dir, err := Dir()
	if err != nil {
		return "", err
	}
	build := filepath.Join(dir, "headers", "build")
	if _, err := os.Stat(filepath.Join(build, "Makefile")); err != nil {
		return "", fmt.Errorf("no kernel headers at %s (run scripts/setup-test-deps.sh: it unpacks linux-headers for the VM kernel)", build)
	}
	if _, err := exec.LookPath("make"); err != nil {
		return "", errors.New("make not installed (apt-get install make)")
	}
	return build, nil
}

// BuildModule builds the kbuild module in directory src (absolute) for
// the VM's kernel and returns the path of name.ko.
func BuildModule(src, name string) (string, error) {
	build, err := KernelBuild()
	if err != nil {
		return "", err
	}
	cmd := exec.Command("make", "-C", build, "M="+src, "modules")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the module in %s: %v\n%s", src, err, out)
	}
	return filepath.Join(src, name+".ko"), nil
}

// SharedLibs returns the files a dynamically linked binary needs in the
// VM (its interpreter and libraries, as ldd finds them here), each at its
// own path, for Config.Files. A static binary needs none.
func SharedLibs(bin string) (map[string]string, error) {
	out, err := exec.Command("ldd", bin).CombinedOutput()
	if err != nil {
		if bytes.Contains(out, []byte("not a dynamic executable")) {
			return nil, nil
		}
		return nil, fmt.Errorf("ldd %s: %v: %s", bin, err, out)
	}
	libs := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		for _, f := range strings.Fields(line) {
			if strings.HasPrefix(f, "/") {
				libs[f] = f
			}
		}
	}
	return libs, nil
}

func copyFile(dst, src string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o755)
}
