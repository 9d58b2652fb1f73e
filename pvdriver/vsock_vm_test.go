//go:build linux && amd64

// The VM is x86-64 (qemu-system-x86_64) and the test binary runs inside it;
// the host side also links the hypervisor, whose tracer is x86-64 only.

package pvdriver_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/internal/lab/vmtest"
	"github.com/vgpuha/vgpuha/internal/lab/workload"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/transport"
)

// inVM is set by the VM's init script: the test then talks vsock for real.
const inVM = "VGPUHA_IN_VM"

// TestVsock runs every workload over vsock inside a qemu VM (vsock loopback,
// CID 1): AF_VSOCK cannot be used on this host. On the host the test boots
// the VM with this same test binary; inside, it serves and dials vsock.
func TestVsock(t *testing.T) {
	if os.Getenv(inVM) == "1" {
		vsockRoundTrip(t)
		return
	}
	if err := vmtest.Available(); err != nil {
		t.Skipf("vsock needs a VM here, and none can be booted: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "pvdriver.test")
	if err := vmtest.BuildTest(".", bin); err != nil {
		t.Fatal(err)
	}
	res, err := vmtest.Run(vmtest.Config{
		Modules: []string{
			"kernel/net/vmw_vsock/vsock.ko",
			"kernel/net/vmw_vsock/vmw_vsock_virtio_transport_common.ko",
			"kernel/net/vmw_vsock/vsock_loopback.ko",
		},
		Files:  map[string]string{"/test/pvdriver.test": bin},
		Script: inVM + "=1 /test/pvdriver.test -test.run '^TestVsock$' -test.v",
	})
	if err != nil {
		t.Fatalf("%v\nconsole:\n%s", err, res.Console)
	}
	t.Logf("inside the VM:\n%s", res.Output)
	if res.ExitCode != 0 || !strings.Contains(res.Output, "--- PASS: TestVsock") {
		t.Fatalf("vsock test failed inside the VM (exit %d)", res.ExitCode)
	}
}

func vsockRoundTrip(t *testing.T) {
	ln, err := transport.Listen("vsock://any:7070")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := hypervisor.NewServer(sim.New(1<<30), hypervisor.DefaultConfig(), prometheus.NewRegistry(),
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pvdriver.Open(ctx, "vsock://1:7070", pvdriver.Options{GuestName: "vm"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ws, _ := workload.Select("all")
	for _, w := range ws {
		r, err := w.Run(ctx, c, 64) // small: the VM emulates every instruction
		if err != nil {
			t.Fatal(err)
		}
		if !r.Verified {
			t.Errorf("%s over vsock: %s", r.Name, r.Detail)
		}
		t.Logf("%s over vsock: verified %s", r.Name, r.Checksum)
	}
}
