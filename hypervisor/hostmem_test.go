package hypervisor_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/internal/lab/cluster"
	"github.com/vgpuha/vgpuha/pvdriver"
)

// hostmemBytes is what the node's copies took from host-memory regions,
// by where they went (device, log).
func hostmemBytes(t *testing.T, reg *prometheus.Registry, to string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "vgpuha_guest_inplace_copy_bytes_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == to {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// pattern is n bytes that differ from a shifted copy of themselves.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) ^ seed
	}
	return b
}

// TestHostMemoryCopies: over shared memory, copies from and into memory
// AllocHost gave run through the region (the node counts the bytes it took
// from there), synchronous and on a stream, and give the right data; a
// guest without a region (plain unix, hostmem=0) gets ErrNoHostMemory and
// its copies work as before.
func TestHostMemoryCopies(t *testing.T) {
	e, sock := startShm(t)
	c := e.client(t, "g")
	const n = 3<<20 + 100
	p := mustAlloc(t, c, n, 0)
	src, err := c.AllocHost(n)
	if err != nil {
		t.Fatal(err)
	}
	copy(src, pattern(n, 1))
	if err := c.CopyHtoD(p, src); err != nil {
		t.Fatal(err)
	}
	if got := hostmemBytes(t, e.reg, "hostmem_device"); got != n {
		t.Fatalf("the node took %v bytes from the region, want %d", got, n)
	}
	if got := read(t, c, p, n); !bytes.Equal(got, src) {
		t.Fatal("device does not hold what the region held")
	}
	dst, err := c.AllocHost(n)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CopyDtoH(dst, p); err != nil || !bytes.Equal(dst, src) {
		t.Fatalf("copy into the region: %v, equal %v", err, bytes.Equal(dst, src))
	}
	s, err := c.CreateStream()
	if err != nil {
		t.Fatal(err)
	}
	copy(src, pattern(n, 2))
	if err := c.CopyHtoDAsync(p, src, s); err != nil {
		t.Fatal(err)
	}
	if err := c.StreamSynchronize(s); err != nil {
		t.Fatal(err)
	}
	if got := read(t, c, p, n); !bytes.Equal(got, src) {
		t.Fatal("stream copy from the region: wrong data")
	}
	if err := c.FreeHost(src); err != nil {
		t.Fatal(err)
	}
	if err := c.FreeHost(src); err == nil {
		t.Fatal("a buffer was freed twice")
	}
	for _, ep := range []string{"unix://" + sock, "shm+unix://" + sock + "?hostmem=0"} {
		e.endpoint = ep
		plain := e.client(t, "plain")
		if _, err := plain.AllocHost(4096); !errors.Is(err, pvdriver.ErrNoHostMemory) {
			t.Fatalf("%s: AllocHost: %v", ep, err)
		}
		served(t, plain, ep)
	}
}

// TestHostMemoryReplicated: a replicated session's copies from its region
// reach the standby (each byte read once, into the log), the replica
// verifies identical, and after a failover the session goes on with the
// same region on a promoted standby that maps it (shm) or inline where it
// cannot (plain unix).
func TestHostMemoryReplicated(t *testing.T) {
	for _, resumeOver := range []string{"shm+unix", "unix"} {
		t.Run("resume over "+resumeOver, func(t *testing.T) {
			c := startPair(t, cluster.Options{GuestScheme: "shm+unix"})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			standby := strings.Replace(c.StandbyEndpoint, "shm+unix", resumeOver, 1)
			g, err := pvdriver.Open(ctx, c.Endpoint, pvdriver.Options{GuestName: "g", Failover: []string{standby}})
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			const n = 2 << 20
			p := mustAlloc(t, g, n, 0)
			buf, err := g.AllocHost(n)
			if err != nil {
				t.Fatal(err)
			}
			copy(buf, pattern(n, 3))
			if err := g.CopyHtoD(p, buf); err != nil {
				t.Fatal(err)
			}
			rep, err := c.Verify()
			if err != nil || !rep.Match {
				t.Fatalf("verify: %+v, %v", rep, err)
			}
			c.KillPrimary()
			if got := read(t, g, p, n); !bytes.Equal(got, buf) {
				t.Fatal("the promoted standby lacks the copy from the region")
			}
			copy(buf, pattern(n, 4))
			if err := g.CopyHtoD(p, buf); err != nil {
				t.Fatal(err)
			}
			out, err := g.AllocHost(n)
			if err != nil {
				t.Fatal(err)
			}
			if err := g.CopyDtoH(out, p); err != nil || !bytes.Equal(out, buf) {
				t.Fatalf("after the failover: %v, equal %v", err, bytes.Equal(out, buf))
			}
			if f := g.Failovers(); len(f) != 1 || f[0].Endpoint != standby {
				t.Fatalf("failovers %+v, want one onto %s", f, standby)
			}
		})
	}
}

// TestHostCopyInManyPieces: a copy of many frames' worth (more pieces than
// the client keeps in flight) lands whole, each way, with a small frame
// limit so the pieces are many.
func TestHostCopyInManyPieces(t *testing.T) {
	cfg := hypervisor.DefaultConfig()
	cfg.MaxPayload = 64 << 10
	e, _ := startShm(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := pvdriver.Open(ctx, e.endpoint, pvdriver.Options{GuestName: "g", MaxPayload: cfg.MaxPayload})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const n = 23*(64<<10) + 999 // more than 20 pieces
	p := mustAlloc(t, c, n, 0)
	src, err := c.AllocHost(n)
	if err != nil {
		t.Fatal(err)
	}
	copy(src, pattern(n, 3)) // seed 3: this test's own
	if err := c.CopyHtoD(p, src); err != nil {
		t.Fatal(err)
	}
	if got := read(t, c, p, n); !bytes.Equal(got, src) {
		t.Fatal("device does not hold what the region held")
	}
	dst, err := c.AllocHost(n)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CopyDtoH(dst, p); err != nil || !bytes.Equal(dst, src) {
		t.Fatalf("copy into the region: %v, equal %v", err, bytes.Equal(dst, src))
	}
	if got := hostmemBytes(t, e.reg, "hostmem_device"); got != n {
		t.Fatalf("the node took %v bytes from the region, want %d", got, n)
	}
}
