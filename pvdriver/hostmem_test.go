package pvdriver

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/pvdriver/transport/shm"
)

func TestHostArena(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("host memory needs Linux")
	}
	region, err := shm.NewHostMemory(16 * hostPage)
	if err != nil {
		t.Fatal(err)
	}
	a := newHostArena(region)
	defer a.close()
	var offs []uint64
	for range 4 {
		off, ok := a.alloc(3 * hostPage)
		if !ok || off%hostPage != 0 {
			t.Fatalf("alloc: %d %v", off, ok)
		}
		offs = append(offs, off)
	}
	if _, ok := a.alloc(5 * hostPage); ok {
		t.Fatal("allocated more than is free")
	}
	if _, ok := a.alloc(1 << 63); ok {
		t.Fatal("allocated an impossible size")
	}
	// Free the middle two: they coalesce into one span of six pages.
	if !a.release(offs[1]) || !a.release(offs[2]) || a.release(offs[2]) {
		t.Fatal("release")
	}
	if off, ok := a.alloc(6 * hostPage); !ok || off != offs[1] {
		t.Fatalf("six pages after coalescing: %d %v", off, ok)
	}
	for _, off := range []uint64{offs[0], offs[1], offs[3]} {
		a.release(off)
	}
	if len(a.free) != 1 || a.free[0] != (hostSpan{0, 16 * hostPage}) {
		t.Fatalf("everything freed, free list %v", a.free)
	}
}

// dialNode serves guests from a node on backend b, on a unix socket of the
// test's own, and returns a connection to it; both end with the test.
func dialNode(t *testing.T, b gpu.Backend) net.Conn {
	t.Helper()
	srv, err := hypervisor.NewServer(b, hypervisor.DefaultConfig(), prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	sock := filepath.Join(t.TempDir(), "g.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	conn, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(context.Background(), "unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// claimsRegion is a plain unix connection that claims the node maps the
// client's region: what a client sees when a host copy it sent on a
// shared-memory connection is resent, after a failover, where no region is.
type claimsRegion struct{ net.Conn }

func (claimsRegion) HostMemoryShared() bool { return true }

// TestHostCopyFallsBackInline: a node without the region refuses host
// copies; the client sends them inline and the data arrives.
func TestHostCopyFallsBackInline(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("host memory needs Linux")
	}
	conn := dialNode(t, sim.New(1<<30))
	region, err := shm.NewHostMemory(2 << 20)
	if err != nil {
		t.Fatal(err)
	}
	c, err := newClient(claimsRegion{conn}, nil, Options{GuestName: "g"}, region)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p, err := c.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	buf, err := c.AllocHost(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	for i := range buf {
		buf[i] = byte(i * 31)
	}
	if err := c.CopyHtoD(p, buf); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(buf))
	if err := c.CopyDtoH(got, p); err != nil || !bytes.Equal(got, buf) {
		t.Fatalf("inline read back: %v, equal %v", err, bytes.Equal(got, buf))
	}
	out, err := c.AllocHost(1 << 19)
	if err == nil {
		err = c.CopyDtoH(out, p)
	}
	if err != nil || !bytes.Equal(out, buf[:1<<19]) {
		t.Fatalf("into the region, inline: %v", err)
	}
}
