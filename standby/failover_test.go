package standby_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/internal/lab/cluster"
	"github.com/vgpuha/vgpuha/internal/lab/faultnet"
	"github.com/vgpuha/vgpuha/internal/lab/workload"
	"github.com/vgpuha/vgpuha/kernels"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/replicate"
)

func failoverCluster(t *testing.T, mode replicate.Mode, scheme ...string) *fixture {
	t.Helper()
	opts := cluster.Options{Replicate: true, Mode: mode, StartStandby: true, Failover: true}
	if len(scheme) > 0 {
		opts.GuestScheme = scheme[0]
	}
	c, err := cluster.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	f := &fixture{Cluster: c, t: t}
	f.waitProtected()
	return f
}

// TestFailoverExactlyOnce: a guest keeps launching a kernel that adds into
// counters (so running a launch twice, or losing one, shows) while the
// primary dies. The standby takes over, the guest resumes there, and the
// counters say every launch ran exactly once. Guests talk over unix
// sockets and over shared memory (shm+unix on both nodes).
func TestFailoverExactlyOnce(t *testing.T) {
	type run struct {
		mode   replicate.Mode
		scheme string
	}
	runs := []run{{replicate.ModeSync, "unix"}, {replicate.ModeCommit, "unix"}}
	if runtime.GOOS == "linux" {
		runs = append(runs, run{replicate.ModeCommit, "shm+unix"})
	}
	for _, r := range runs {
		mode := r.mode
		t.Run(mode.String()+"/"+r.scheme, func(t *testing.T) {
			c := failoverCluster(t, mode, r.scheme)
			g := c.guest("counter")
			img, _ := kernels.Image("histogram")
			m, err := g.LoadModule(img)
			if err != nil {
				t.Fatal(err)
			}
			f, err := g.GetFunction(m, "histogram")
			if err != nil {
				t.Fatal(err)
			}
			const n, nbins = 1024, 8
			data := make([]byte, 4*n)
			for i := 0; i < n; i++ {
				binary.LittleEndian.PutUint32(data[4*i:], uint32(i))
			}
			dd, _ := g.Alloc(4 * n)
			if err := g.CopyHtoD(dd, data); err != nil {
				t.Fatal(err)
			}
			bins, _ := g.Alloc(4 * nbins)
			if err := g.Memset8(bins, 0, 4*nbins); err != nil {
				t.Fatal(err)
			}
			cfg := pvdriver.LaunchConfig{Grid: pvdriver.Dim(n / 256), Block: pvdriver.Dim(256)}
			const launches = 400
			killed := false
			for i := 0; i < launches; i++ {
				if err := g.Launch(f, cfg, pvdriver.Ptr(dd), pvdriver.U32(n), pvdriver.Ptr(bins), pvdriver.U32(nbins)); err != nil {
					t.Fatalf("launch %d: %v", i, err)
				}
				if i%25 == 24 {
					if err := g.Synchronize(); err != nil {
						t.Fatalf("sync after launch %d: %v", i, err)
					}
				}
				if i == 230 && !killed { // mid-batch: some launches unsynchronized
					c.KillPrimary()
					killed = true
				}
			}
			if err := g.Synchronize(); err != nil {
				t.Fatal(err)
			}
			out := make([]byte, 4*nbins)
			if err := g.CopyDtoH(out, bins); err != nil {
				t.Fatal(err)
			}
			for b := 0; b < nbins; b++ {
				if got := binary.LittleEndian.Uint32(out[4*b:]); got != launches*n/nbins {
					t.Fatalf("bin %d counts %d, want %d: launches lost or repeated", b, got, launches*n/nbins)
				}
			}
			fo := g.Failovers()
			p := c.Standby.Promoted()
			if len(fo) != 1 || p == nil || p.Term != 2 {
				t.Fatalf("failovers %+v, promotion %+v", fo, p)
			}
			t.Logf("%s: detected after %.0f ms of silence, serving %.1f ms later; guest paused %v, resent %d requests",
				mode, p.DetectionMS, p.PromotionMS, fo[0].Resumed.Sub(fo[0].Lost).Round(time.Millisecond), fo[0].Resent)
		})
	}
}

// TestFailoverWorkloads: every workload finishes with verified results on
// the promoted standby when the primary dies while guests run.
func TestFailoverWorkloads(t *testing.T) {
	c := failoverCluster(t, replicate.ModeCommit)
	want := map[string]string{}
	done := make(chan error, 1)
	g := c.guest("g")
	go func() {
		ws, _ := workload.Select("all")
		for round := 0; round < 3; round++ {
			for _, w := range ws {
				r, err := w.Run(context.Background(), g, 0)
				if err != nil {
					done <- err
					return
				}
				if !r.Verified {
					t.Errorf("round %d %s: %s", round, r.Name, r.Detail)
				}
				if prev, ok := want[r.Name]; ok && prev != r.Checksum {
					t.Errorf("round %d %s: checksum %s differs from the fault-free round's %s", round, r.Name, r.Checksum, prev)
				}
				want[r.Name] = r.Checksum
			}
			if round == 0 {
				c.KillPrimary()
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("guest did not finish after failover")
	}
	if len(g.Failovers()) != 1 {
		t.Fatalf("failovers: %+v", g.Failovers())
	}
}

// TestLinkCutAloneDoesNotPromote: with the TCP replication link cut but the
// primary alive (its UDP heartbeats still arrive), the standby does not take
// over; once the primary really dies, it does.
func TestLinkCutAloneDoesNotPromote(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: waits four detection timeouts (about 1.3 s)")
	}
	c := failoverCluster(t, replicate.ModeCommit)
	g := c.guest("g")
	if _, err := g.Alloc(4096); err != nil {
		t.Fatal(err)
	}
	c.CutReplicationLink()
	time.Sleep(time.Second) // four times the detection timeout
	if p := c.Standby.Promoted(); p != nil {
		t.Fatalf("standby took over from a live primary after a link cut: %+v", p)
	}
	if _, err := g.Alloc(4096); err != nil { // the primary serves on, unprotected
		t.Fatal(err)
	}
	c.KillPrimary()
	c.waitPromoted(5 * time.Second)
	// The standby never got the second alloc, which the guest saw succeed:
	// the guest is told it was rolled back instead of carrying on.
	if err := g.Synchronize(); !errors.Is(err, pvdriver.ErrRolledBack) {
		t.Fatalf("after failing over to a stale standby: %v, want ErrRolledBack", err)
	}
}

// TestGuestLinkCutResumesOnPrimary: a guest whose connection to a live
// primary breaks gets its session back there (the primary kept it for the
// guest's grace period), with every launch applied exactly once, and the
// standby does not take over.
func TestGuestLinkCutResumesOnPrimary(t *testing.T) {
	c := failoverCluster(t, replicate.ModeCommit)
	ep := "unix://" + filepath.Join(t.TempDir(), "proxy.sock")
	px, err := faultnet.Listen(ep, c.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	g, err := pvdriver.Open(ctx, ep, pvdriver.Options{GuestName: "blip", Failover: []string{c.StandbyEndpoint}})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	w, _ := workload.Lookup("histogram")
	want, err := w.Run(context.Background(), g, 0)
	if err != nil {
		t.Fatal(err)
	}
	px.Cut()
	for i := 0; i < 3; i++ {
		r, err := w.Run(context.Background(), g, 0)
		if err != nil {
			t.Fatalf("after the cut: %v", err)
		}
		if !r.Verified || r.Checksum != want.Checksum {
			t.Fatalf("after the cut: %+v", r)
		}
	}
	if fo := g.Failovers(); len(fo) != 1 || fo[0].Endpoint != ep || fo[0].Term != 1 {
		t.Fatalf("failovers: %+v (want one resume on the same primary)", fo)
	}
	if p := c.Standby.Promoted(); p != nil {
		t.Fatalf("standby took over after a guest-side blip: %+v", p)
	}
	if n := len(c.Primary.Status().Sessions); n != 1 {
		t.Fatalf("primary holds %d sessions, want the resumed one", n)
	}
}

// TestCloseFreesAtOnce: a failover-capable guest that closes its session on
// purpose does not leave it held for a resume.
func TestCloseFreesAtOnce(t *testing.T) {
	c := failoverCluster(t, replicate.ModeCommit)
	g := c.guest("leaving")
	if _, err := g.Alloc(1 << 20); err != nil {
		t.Fatal(err)
	}
	g.Close()
	deadline := time.Now().Add(2 * time.Second)
	for len(c.Primary.Status().Sessions) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("session still held after Close: %+v", c.Primary.Status().Sessions)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestFrameBuffersOwnedUntilWritten: with failover on, a guest keeps every
// request until a commit point, and the writer may still be writing one
// when its commit reply arrives. Bulk copies and commit points alternate
// here, each copy's data distinct; run with -race, a frame buffer given
// back for reuse while the writer still reads it shows as a data race,
// and without -race as wrong data on the device.
func TestFrameBuffersOwnedUntilWritten(t *testing.T) {
	schemes := []string{"unix"}
	if runtime.GOOS == "linux" {
		schemes = append(schemes, "shm+unix")
	}
	for _, scheme := range schemes {
		t.Run(scheme, func(t *testing.T) {
			c := failoverCluster(t, replicate.ModeCommit, scheme)
			g := c.guest("frames")
			const size = 300 << 10
			p, err := g.Alloc(size)
			if err != nil {
				t.Fatal(err)
			}
			data, back := make([]byte, size), make([]byte, 64)
			for i := range 200 {
				for j := range data {
					data[j] = byte(i + j)
				}
				if err := g.CopyHtoDAsync(p, data, 0); err != nil {
					t.Fatal(err)
				}
				for range 3 { // commit points, whose small frames reuse each other's buffers
					if err := g.CopyDtoH(back, p+pvdriver.DevicePtr(size-64)); err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(back, data[size-64:]) {
						t.Fatalf("round %d: device holds other bytes than the guest sent", i)
					}
				}
			}
		})
	}
}
