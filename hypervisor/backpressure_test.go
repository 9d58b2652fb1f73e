package hypervisor_test

import (
	"context"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/internal/lab/cluster"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/pvdriver/transport/shm"
)

// procStatus is a field of this process's /proc/self/status in bytes
// (VmRSS, VmHWM).
func procStatus(t *testing.T, field string) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip("no /proc/self/status:", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == field+":" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	t.Skip("no " + field)
	return 0
}

// sessionRequests is how many requests the primary has run for the
// session of guest (0: none open).
func sessionRequests(srv *hypervisor.Server, guest string) uint64 {
	for _, s := range srv.Status().Sessions {
		if s.Guest == guest {
			return s.Requests
		}
	}
	return 0
}

// waitStalled waits until the session of guest runs no more requests
// (its count stays put for two seconds) or its count reaches all, and
// returns the count.
func waitStalled(t *testing.T, srv *hypervisor.Server, guest string, all uint64) uint64 {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	last, since := sessionRequests(srv, guest), time.Now()
	for time.Since(since) < 2*time.Second && last < all {
		if time.Now().After(deadline) {
			t.Fatalf("the flooding guest's requests never stopped running (%d run)", last)
		}
		time.Sleep(50 * time.Millisecond)
		if n := sessionRequests(srv, guest); n != last {
			last, since = n, time.Now()
		}
	}
	return last
}

// dialFrames is a raw guest on a unix:// or shm+unix:// endpoint (over
// shared memory its frames go through the rings).
func dialFrames(t *testing.T, endpoint string) *raw {
	t.Helper()
	path, ok := strings.CutPrefix(endpoint, "shm+unix://")
	if !ok {
		return dialRawAt(t, endpoint)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := shm.Dial(ctx, path, shm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &raw{t: t, conn: conn, fr: abi.NewFrameReader(conn, 1<<20)}
}

// floodReads opens a session as guest "flood" on endpoint, allocates
// 16 MiB and sends reads reads of 16 MiB (less 64 bytes: the largest a
// reply holds) without reading a reply. The guest's write may block once
// the node stops reading: it ends on sent.
func floodReads(t *testing.T, endpoint string, reads int) (flood *raw, sent <-chan error) {
	t.Helper()
	flood = dialFrames(t, endpoint)
	if st, msg := flood.send(abi.OpHello, 0, 1, &abi.Hello{GuestName: "flood", GraceMS: 60000}, &abi.HelloReply{}); st != abi.StatusOK {
		t.Fatalf("hello: %v %s", st, msg)
	}
	var a abi.AllocReply
	if st, msg := flood.send(abi.OpAlloc, 0, 2, &abi.Alloc{Size: 16 << 20}, &a); st != abi.StatusOK {
		t.Fatalf("alloc: %v %s", st, msg)
	}
	n := uint64(hypervisor.DefaultConfig().MaxPayload - 64)
	var frames []byte
	for i := range uint64(reads) {
		frames = abi.AppendBodyFrame(frames, abi.OpCopyDtoH, 0, 3+i, &abi.CopyDtoH{Src: a.Ptr, Size: n})
	}
	done := make(chan error, 1)
	go func() {
		_, err := flood.conn.Write(frames)
		done <- err
	}()
	return flood, done
}

// unreadReads is how many 16 MiB reads TestUnreadRepliesBoundMemory's
// guest sends without reading a reply.
const unreadReads = 1000

// TestUnreadRepliesBoundMemory: on a replicated primary in commit mode, a
// guest sends 1,000 copy_dtoh of 16 MiB on one connection and reads none
// of the replies, over a unix socket and over shared memory. The node
// reads none of its requests once the connection's queued replies hold
// more than --guest.reply-queue-bytes (back-pressure), so the process
// (primary, standby and both guests) grows by less than 512 MiB where the
// replies alone would be 16 GiB, and another guest is served meanwhile.
// The write deadline is set long here: TestGuestReadingNothingIsDropped
// tests it.
func TestUnreadRepliesBoundMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("holds 16 MiB reads")
	}
	if raceDetector {
		t.Skip("memory figures mean nothing under the race detector; make test runs this test without -race")
	}
	for _, scheme := range []string{"unix", "shm+unix"} {
		t.Run(scheme, func(t *testing.T) { unreadRepliesBoundMemory(t, scheme) })
	}
}

func unreadRepliesBoundMemory(t *testing.T, scheme string) {
	c := startPair(t, cluster.Options{GuestScheme: scheme, Hypervisor: func(cfg *hypervisor.Config) { cfg.WriteTimeout = 10 * time.Minute }})
	other := guest(t, c, "other")
	served(t, other, "another guest, before the flood")
	debug.FreeOSMemory()
	os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) // the peak (VmHWM) starts again from here, where the kernel allows
	before, peakBefore := procStatus(t, "VmRSS"), procStatus(t, "VmHWM")

	flood, sent := floodReads(t, c.Endpoint, unreadReads)
	ran := waitStalled(t, c.Primary, "flood", 1+unreadReads)
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	debug.FreeOSMemory()
	growth, peak := procStatus(t, "VmRSS")-before, procStatus(t, "VmHWM")-peakBefore
	start := time.Now()
	served(t, other, "another guest, beside the flood")
	t.Logf("%d of %d unread 16 MiB reads ran before the node stopped reading; RSS grew by %.0f MiB (peak VmHWM +%.0f MiB), live heap %.0f MiB; another guest was served in %v",
		ran-1, unreadReads, float64(growth)/(1<<20), float64(peak)/(1<<20), float64(ms.HeapAlloc)/(1<<20), time.Since(start).Round(time.Millisecond))
	if ran >= 1+unreadReads || growth >= 512<<20 {
		t.Fatalf("the node ran %d of %d unread reads and grew by %d MiB", ran-1, unreadReads, growth>>20)
	}
	flood.conn.Close()
	select {
	case <-sent:
	case <-time.After(time.Minute):
		t.Fatal("the flooding guest's write never returned after its connection closed")
	}
}

// TestGuestReadingNothingIsDropped: a guest that sends 16 MiB reads and
// reads no reply loses its connection after the write timeout, whether
// the node wrote the reply itself (unreplicated) or from its reply queue
// (replicated, commit mode); its session is kept for its grace period,
// as any whose connection dropped, and the drop is counted.
func TestGuestReadingNothingIsDropped(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for write timeouts")
	}
	short := func(cfg *hypervisor.Config) { cfg.WriteTimeout = time.Second }
	t.Run("unreplicated", func(t *testing.T) {
		cfg := hypervisor.DefaultConfig()
		short(&cfg)
		e := start(t, cfg)
		floodReads(t, e.endpoint, 100)
		waitFloodDropped(t, e.srv)
		if n := counter(t, e, "vgpuha_guest_write_timeouts_total", nil); n != 1 {
			t.Fatalf("%v write timeouts counted, want 1", n)
		}
		served(t, e.client(t, "next"), "a guest after the drop")
	})
	for _, scheme := range []string{"unix", "shm+unix"} {
		t.Run("commit over "+scheme, func(t *testing.T) {
			c := startPair(t, cluster.Options{GuestScheme: scheme, Hypervisor: short})
			floodReads(t, c.Endpoint, 100)
			waitFloodDropped(t, c.Primary)
			served(t, guest(t, c, "next"), "a guest after the drop")
		})
	}
}

// waitFloodDropped waits until the session of guest "flood" is kept
// without a connection, for a grace period.
func waitFloodDropped(t *testing.T, srv *hypervisor.Server) {
	t.Helper()
	deadline := time.Now().Add(time.Minute) // the write timeout is a second: a minute is for a loaded machine
	for {
		for _, s := range srv.Status().Sessions {
			if s.Guest != "flood" || !s.Detached {
				continue
			}
			if s.ExpiresInSeconds <= 0 {
				t.Fatalf("the dropped guest's session is not kept for a grace period: %+v", s)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a guest that read no reply was never dropped: %+v", srv.Status().Sessions)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
