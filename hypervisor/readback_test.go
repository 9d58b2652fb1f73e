package hypervisor_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/internal/lab/cluster"
	"github.com/vgpuha/vgpuha/replicate"
)

// TestReadBackIgnoresGuestRewrites: over shared memory, a guest thread
// rewrites its host-memory buffer without pause while copy_dtoh_hostmem
// copies device memory into that buffer, again and again. The read-back
// the node logs for each copy holds what the device returned, never what
// the thread wrote after it: verify matches after every round (it would
// not if a read-back were taken from the guest's region).
func TestReadBackIgnoresGuestRewrites(t *testing.T) {
	c := startPair(t, cluster.Options{GuestScheme: "shm+unix"})
	g := guest(t, c, "g")
	const n = 1 << 20
	p := mustAlloc(t, g, n, 0)
	if err := g.CopyHtoD(p, pattern(n, 9)); err != nil {
		t.Fatal(err)
	}
	buf, err := g.AllocHost(n)
	if err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the racing guest thread
		defer wg.Done()
		for i := 0; !stop.Load(); i++ {
			for j := 0; j < n; j += 64 {
				buf[j] = byte(i)
			}
		}
	}()
	defer func() { stop.Store(true); wg.Wait() }()
	for round := 0; round < 20; round++ {
		for range 10 {
			if err := g.CopyDtoH(buf, p); err != nil {
				t.Fatal(err)
			}
		}
		rep, err := c.Verify()
		if err != nil {
			t.Fatal(err)
		}
		if !rep.Match {
			t.Fatalf("round %d: the standby's copy differs from the device's after reads into a buffer a guest thread rewrote: %+v", round, rep)
		}
	}
}

// BenchmarkReplicatedHostRead: copy_dtoh_hostmem on a replicated primary
// in commit mode over shared memory (the software GPU): each read is
// logged (a check, from 64 KiB), so its cost includes taking the device's
// bytes for the log and the standby's acknowledgement.
func BenchmarkReplicatedHostRead(b *testing.B) { benchReplicatedRead(b, "shm+unix", true, 0) }

// BenchmarkReplicatedRead: copy_dtoh, the data in its reply, on a
// replicated primary in commit mode over a unix socket: reads of 64 KiB
// or more go as read checks (the default).
func BenchmarkReplicatedRead(b *testing.B) { benchReplicatedRead(b, "unix", false, 0) }

// BenchmarkReplicatedReadBytes is BenchmarkReplicatedRead with read checks
// off (--replicate.read-check-bytes 0): every read's bytes go on the link.
func BenchmarkReplicatedReadBytes(b *testing.B) { benchReplicatedRead(b, "unix", false, -1) }

// benchReplicatedRead reports each read's time and the link's bytes per
// read; readCheck is the primary's node.Config.ReadCheckBytes.
func benchReplicatedRead(b *testing.B, scheme string, host bool, readCheck int64) {
	for _, size := range []int{64 << 10, 4 << 20} {
		b.Run(byteSize(size), func(b *testing.B) {
			c, err := cluster.Start(cluster.Options{GuestScheme: scheme, Replicate: true, StartStandby: true, Mode: replicate.ModeCommit,
				ReadCheckBytes: readCheck})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			if err := c.WaitProtected(time.Minute); err != nil {
				b.Fatal(err)
			}
			g, err := c.Guest("bench")
			if err != nil {
				b.Fatal(err)
			}
			defer g.Close()
			p, err := g.Alloc(uint64(size))
			if err != nil {
				b.Fatal(err)
			}
			buf := make([]byte, size)
			if host {
				if buf, err = g.AllocHost(size); err != nil {
					b.Fatal(err)
				}
			}
			sent := c.Sender.Status().SentBytes
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if err := g.CopyDtoH(buf, p); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(c.Sender.Status().SentBytes-sent)/float64(b.N), "link-B/read")
		})
	}
}

func byteSize(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}
