package standby_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/internal/workload"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/replicate"
	"github.com/vgpuha/vgpuha/standby"
)

var key = []byte("0123456789abcdef0123456789abcdef")

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// cluster is a primary and a standby in one process, over real sockets.
type cluster struct {
	t        *testing.T
	primary  *hypervisor.Server
	log      *replicate.Log
	sender   *replicate.Sender
	verifier replicate.Verifier
	endpoint string
	addr     string // standby's replication address
	shift    uint64

	standby *standby.Agent
	ln      net.Listener
}

func newCluster(t *testing.T, mode replicate.Mode, shift uint64, withStandby bool) *cluster {
	t.Helper()
	c := &cluster{t: t, shift: shift}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.addr = ln.Addr().String()
	ln.Close()
	if withStandby {
		c.startStandby()
	}
	srv, err := hypervisor.NewServer(sim.New(1<<30), hypervisor.DefaultConfig(), prometheus.NewRegistry(), quiet())
	if err != nil {
		t.Fatal(err)
	}
	c.primary = srv
	c.log = replicate.NewLog(8 << 20)
	srv.Replicate(c.log, mode)
	c.sender, err = replicate.NewSender(replicate.SenderConfig{Addr: c.addr, Key: key, Mode: mode, Log: c.log,
		Snapshot: srv.Snapshot, OnVerify: c.verifier.Deliver, Log_: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go c.sender.Run(ctx)
	sock := filepath.Join(t.TempDir(), "g.sock")
	gl, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(gl)
	c.endpoint = "unix://" + sock
	t.Cleanup(func() {
		cancel()
		srv.Close()
		c.log.Close()
		c.stopStandby()
	})
	return c
}

func (c *cluster) startStandby() {
	c.t.Helper()
	backend := sim.New(1 << 30)
	backend.BaseShift = c.shift
	a, err := standby.New(backend, hypervisor.DefaultConfig(), key, prometheus.NewRegistry(), quiet())
	if err != nil {
		c.t.Fatal(err)
	}
	var ln net.Listener
	for i := 0; i < 50; i++ { // the port may linger briefly after a stop
		if ln, err = net.Listen("tcp", c.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		c.t.Fatal(err)
	}
	c.standby, c.ln = a, ln
	go a.Serve(ln)
}

func (c *cluster) stopStandby() {
	if c.standby != nil {
		c.ln.Close()
		c.standby.Close()
		c.standby = nil
	}
}

func (c *cluster) waitProtected() {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !c.sender.Status().Protected {
		if time.Now().After(deadline) {
			c.t.Fatalf("standby never caught up: %+v", c.sender.Status())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (c *cluster) verify() replicate.Report {
	c.t.Helper()
	c.waitProtected()
	rep, err := c.verifier.Verify(c.primary.VerifyPoint, 10*time.Second)
	if err != nil {
		c.t.Fatal(err)
	}
	return rep
}

func (c *cluster) guest(name string) *pvdriver.Client {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	g, err := pvdriver.Open(ctx, c.endpoint, pvdriver.Options{GuestName: name})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { g.Close() })
	return g
}

// runGuests runs every workload in n concurrent guests that stay connected.
func (c *cluster) runGuests(n, size int) {
	c.t.Helper()
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		g := c.guest("g")
		wg.Add(1)
		go func() {
			defer wg.Done()
			ws, _ := workload.Select("all")
			for _, w := range ws {
				r, err := w.Run(context.Background(), g, size)
				if err != nil {
					c.t.Error(err)
					return
				}
				if !r.Verified {
					c.t.Errorf("%s: %s", r.Name, r.Detail)
				}
			}
		}()
	}
	wg.Wait()
}

func mustMatch(t *testing.T, rep replicate.Report) {
	t.Helper()
	if !rep.Match || rep.Objects == 0 {
		t.Fatalf("replica differs: %d objects, mismatches %+v", rep.Objects, rep.Mismatches)
	}
}

// TestModesReplicaIdentical: for every mode, three guests run every
// workload and the replica ends bit-identical.
func TestModesReplicaIdentical(t *testing.T) {
	for _, mode := range []replicate.Mode{replicate.ModeSync, replicate.ModeCommit, replicate.ModeAsync, replicate.ModeEpoch} {
		t.Run(mode.String(), func(t *testing.T) {
			c := newCluster(t, mode, 0, true)
			c.waitProtected()
			c.runGuests(3, 0)
			rep := c.verify()
			mustMatch(t, rep)
			t.Logf("%s: %d objects, %d bytes identical", mode, rep.Objects, rep.Bytes)
		})
	}
}

// TestStandbyLateAndRestarted: a standby that starts mid-run is resynced
// from a snapshot; one restarted mid-run (a fresh replica) is too; both end
// identical while the guests keep running.
func TestStandbyLateAndRestarted(t *testing.T) {
	c := newCluster(t, replicate.ModeCommit, 0, false)
	c.runGuests(2, 0) // no standby: the primary serves unprotected
	if st := c.sender.Status(); st.State != "unprotected" {
		t.Fatalf("state without a standby: %s", st.State)
	}
	c.startStandby()
	mustMatch(t, c.verify())
	if c.sender.Status().Resyncs != 1 {
		t.Errorf("resyncs: %d", c.sender.Status().Resyncs)
	}
	c.runGuests(2, 0)
	c.stopStandby()
	c.runGuests(1, 0) // while the standby is down
	c.startStandby()
	mustMatch(t, c.verify())
	c.runGuests(1, 0)
	mustMatch(t, c.verify())
}

// TestLinkCutResumesFromLog: a broken link to a standby that kept its state
// catches up from the log, without a snapshot.
func TestLinkCutResumesFromLog(t *testing.T) {
	c := newCluster(t, replicate.ModeAsync, 0, true)
	c.waitProtected()
	c.runGuests(1, 0)
	c.standby.Receiver.Close() // cut the link; the standby keeps its replica
	c.runGuests(1, 0)
	mustMatch(t, c.verify())
	if n := c.sender.Status().Resyncs; n != 1 {
		t.Errorf("resyncs after a link cut: %d, want 1 (the first attach only)", n)
	}
}

// TestTranslatedBase: a standby whose windows land at another base
// translates addresses: everything but pointer_chase verifies identical,
// and pointer_chase's session is reported unsafe instead of silently wrong.
func TestTranslatedBase(t *testing.T) {
	c := newCluster(t, replicate.ModeSync, 1<<40, true)
	c.waitProtected()
	g := c.guest("translated")
	for _, name := range []string{"vadd", "saxpy", "matmul", "reduce_sum", "histogram"} {
		w, _ := workload.Lookup(name)
		if r, err := w.Run(context.Background(), g, 0); err != nil || !r.Verified {
			t.Fatalf("%s: %v %+v", name, err, r)
		}
	}
	mustMatch(t, c.verify())
	st := c.standby.Status().Replica.Sessions
	if len(st) != 1 || !st[0].Translated || st[0].Unsafe != "" {
		t.Fatalf("replica session: %+v", st)
	}
	w, _ := workload.Lookup("pointer_chase")
	if r, err := w.Run(context.Background(), g, 256); err != nil || !r.Verified {
		t.Fatalf("pointer_chase on the primary: %v %+v", err, r)
	}
	if rep := c.verify(); rep.Match {
		t.Error("pointer_chase's output verified identical on a translated replica")
	}
	st = c.standby.Status().Replica.Sessions
	if !strings.Contains(st[0].Unsafe, "translated") {
		t.Errorf("pointer_chase on a translated replica not reported unsafe: %q", st[0].Unsafe)
	}
}

// TestRepair: a replica object changed behind replication's back is found
// by verify and repaired from the primary.
func TestRepair(t *testing.T) {
	c := newCluster(t, replicate.ModeCommit, 0, true)
	c.waitProtected()
	g := c.guest("g")
	p, err := g.Alloc(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.CopyHtoD(p, bytes.Repeat([]byte{7}, 1<<16)); err != nil {
		t.Fatal(err)
	}
	mustMatch(t, c.verify())
	// Corrupt the replica directly, as a flaky device or a bug would.
	c.standby.Server.ApplyRecord(&replicate.Record{Session: g.Session(), Op: replicate.Op(4 /* copy_htod */), Flags: replicate.FlagRepair,
		Body: appendCopy(uint64(p)+100, []byte{1, 2, 3})})
	rep := c.verify()
	if rep.Match || len(rep.Mismatches) != 1 || !rep.Mismatches[0].Repairable {
		t.Fatalf("corrupted replica: %+v", rep)
	}
	if err := c.primary.Repair(g.Session(), uint64(p)); err != nil {
		t.Fatal(err)
	}
	mustMatch(t, c.verify())
}

func appendCopy(dst uint64, data []byte) []byte {
	b := make([]byte, 0, 20+len(data))
	for i := 0; i < 8; i++ {
		b = append(b, byte(dst>>(8*i)))
	}
	b = append(b, make([]byte, 8)...) // stream 0
	n := uint32(len(data))
	b = append(b, byte(n), byte(n>>8), byte(n>>16), byte(n>>24))
	return append(b, data...)
}

// TestRefusesUnauthenticatedAndCorrupt: a peer with the wrong key, or a
// stream with a flipped bit, is refused and nothing from it is applied.
func TestRefusesUnauthenticatedAndCorrupt(t *testing.T) {
	c := newCluster(t, replicate.ModeCommit, 0, true)
	c.waitProtected()
	// A primary with the wrong key.
	wrong, _ := replicate.NewSender(replicate.SenderConfig{Addr: c.addr, Key: []byte("not-the-right-key-at-all"), Log: replicate.NewLog(1 << 20),
		Snapshot: func() ([]replicate.Record, time.Duration) { return nil, 0 }, Log_: quiet()})
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	wrong.Run(ctx)
	cancel()
	if st := c.standby.Receiver.Status(); st.RefusedPeers == 0 {
		t.Errorf("wrong key not refused: %+v", st)
	}
	if s := wrong.Status(); !strings.Contains(s.LastError, "authentication") {
		t.Errorf("sender with the wrong key: %q", s.LastError)
	}
	// Raw garbage and a replayed handshake.
	for _, junk := range [][]byte{[]byte("GET / HTTP/1.0\r\n\r\n"), append([]byte("VGRA\x01\x00"), make([]byte, 64)...)} {
		conn, err := net.Dial("tcp", c.addr)
		if err != nil {
			t.Fatal(err)
		}
		conn.Write(junk)
		conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		io.ReadAll(conn)
		conn.Close()
	}
	if n := len(c.standby.Status().Replica.Sessions); n != 0 {
		t.Fatalf("refused peers created %d replica sessions", n)
	}
	// The real primary still streams.
	c.runGuests(1, 0)
	mustMatch(t, c.verify())
}
