package mmioguest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/internal/lab/cluster"
	"github.com/vgpuha/vgpuha/internal/node"
	"github.com/vgpuha/vgpuha/mmiotrace"
	"github.com/vgpuha/vgpuha/replicate"
	"github.com/vgpuha/vgpuha/replicate/link"
)

// The guest runs as this test binary in its own process (and process
// group), as the tracer requires.
func TestMain(m *testing.M) {
	if args := os.Getenv("MMIOGUEST_ARGS"); args != "" {
		var a []string
		json.Unmarshal([]byte(args), &a)
		if err := MainArgs(a, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "mmio-guest:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// guestCommand is this test binary as the guest, with args for Main.
func guestCommand(args ...string) *exec.Cmd {
	cmd := mmiotrace.GuestCommand(exec.Command(os.Args[0], "-test.run=^$"))
	a, _ := json.Marshal(args)
	cmd.Env = append(os.Environ(), "MMIOGUEST_ARGS="+string(a))
	cmd.Stderr = os.Stderr
	return cmd
}

func runGuest(t *testing.T, args ...string) Result {
	t.Helper()
	cmd := guestCommand(args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var res Result
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		json.Unmarshal(sc.Bytes(), &res)
	}
	if err := mmiotrace.WaitExit(cmd); err != nil {
		t.Fatalf("guest %v: %v", args, err)
	}
	return res
}

// TestReplicaAperturesEqual runs every workload in every mode against a
// replicated primary. The device's copy of each aperture must equal the
// guest's memory when the writes are traced (and must not in off mode,
// which proves the check can fail), and the standby must end bit-identical
// to the primary.
func TestReplicaAperturesEqual(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts and traces guest processes")
	}
	for _, mode := range mmiotrace.Modes() {
		t.Run(mode.String(), func(t *testing.T) {
			if err := mmiotrace.ModeAvailable(mode); err != nil {
				t.Skipf("%s mode cannot run here: %v", mode, err)
			}
			c, err := cluster.Start(cluster.Options{Replicate: true, StartStandby: true, Mode: replicate.ModeCommit,
				MMIO: &hypervisor.MMIOConfig{Mode: mode, Pin: true, FlushEvery: 5_000_000}})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			for _, w := range Workloads {
				res, stop := holdGuest(t, "--addr", c.Endpoint, "--workload", w, "--writes", "3000", "--aperture-bytes", "262144")
				if res.Mode != mode.String() || res.Writes == 0 {
					t.Fatalf("%s: %+v", w, res)
				}
				if res.Verified != (mode != mmiotrace.ModeOff) {
					t.Fatalf("%s in %s mode: device copy matches the guest's aperture: %v", w, mode, res.Verified)
				}
				// verify --apertures while the guest holds them: in off
				// mode both device copies are stale.
				rep, err := c.Verify()
				if err != nil {
					t.Fatal(err)
				}
				traced := mode != mmiotrace.ModeOff
				for _, a := range rep.Apertures {
					if a.Primary.Match() != traced || a.Standby.Match() != traced {
						t.Fatalf("%s in %s mode: verify --apertures %+v", w, mode, rep.Apertures)
					}
				}
				if len(rep.Apertures) == 0 || rep.Match != traced {
					t.Fatalf("%s in %s mode: verify --apertures %+v", w, mode, rep)
				}
				t.Logf("%s mode, %s: verify --apertures %+v", mode, w, rep.Apertures)
				stop()
			}
			// The last guest's session ends once the primary sees it gone;
			// until then its aperture (stale in off mode) is still compared.
			for deadline := time.Now().Add(10 * time.Second); len(c.Primary.Status().Sessions) > 0; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the guests' sessions outlived them: %+v", c.Primary.Status().Sessions)
				}
			}
			rep, err := c.Verify()
			if err != nil {
				t.Fatal(err)
			}
			if !rep.Match {
				t.Fatalf("standby differs from the primary: %+v", rep)
			}
		})
	}
}

// holdGuest runs a guest with --hold: it returns the guest's result once
// the run is done (the guest keeps its session and apertures) and a
// function that ends the guest.
func holdGuest(t *testing.T, args ...string) (Result, func()) {
	t.Helper()
	cmd := guestCommand(append(args, "--hold")...)
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stop := func() { cmd.Process.Kill(); mmiotrace.WaitExit(cmd) }
	sc := bufio.NewScanner(out)
	var res Result
	if !sc.Scan() || json.Unmarshal(sc.Bytes(), &res) != nil {
		stop()
		t.Fatalf("guest %v said %q", args, sc.Text())
	}
	return res, stop
}

// TestApertureSurvivesFailover kills the primary between two rounds of
// aperture writes. The guest resumes on the promoted standby, which takes
// the aperture over (re-attach) and starts from its current contents: the
// device copy there must equal everything the guest wrote, including what
// it wrote while no node was tracing it. In the kmod modes the guest's
// mapping is the module's: the standby adopts the aperture the primary
// left (where the module is loaded: in the VM of kmod's TestModuleInVM).
func TestApertureSurvivesFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts and traces guest processes")
	}
	modes := []mmiotrace.Mode{mmiotrace.ModeUffd, mmiotrace.ModePage, mmiotrace.ModeAuto, mmiotrace.ModeKmod, mmiotrace.ModeKmodPage, mmiotrace.ModeKmodAuto}
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			if err := mmiotrace.ModeAvailable(mode); err != nil {
				t.Skipf("%s mode cannot run here: %v", mode, err)
			}
			c, err := cluster.Start(cluster.Options{Replicate: true, StartStandby: true, Failover: true, Mode: replicate.ModeCommit,
				MMIO: &hypervisor.MMIOConfig{Mode: mode, Pin: true, FlushEvery: 5_000_000}})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			cmd := guestCommand("--addr", c.Endpoint, "--failover", c.StandbyEndpoint, "--workload", "failover",
				"--writes", "3000", "--aperture-bytes", "262144")
			stdin, _ := cmd.StdinPipe()
			out, _ := cmd.StdoutPipe()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			sc := bufio.NewScanner(out)
			if !sc.Scan() || sc.Text() != `{"paused":true}` {
				t.Fatalf("guest said %q", sc.Text())
			}
			if err := c.WaitProtected(time.Minute); err != nil {
				t.Fatal(err)
			}
			st := c.Primary.Status()
			if len(st.Sessions) != 1 || st.Sessions[0].MMIO == nil || st.Sessions[0].MMIO.Apertures != 1 ||
				st.Sessions[0].MMIO.Mode != mode.String() || st.Sessions[0].MMIO.Records == 0 {
				t.Fatalf("primary status while the guest holds an aperture: %+v", st.Sessions)
			}
			c.KillPrimary()
			fmt.Fprintln(stdin)
			var res Result
			for sc.Scan() {
				json.Unmarshal(sc.Bytes(), &res)
			}
			if err := mmiotrace.WaitExit(cmd); err != nil {
				t.Fatal(err)
			}
			if res.Failovers != 1 || !res.Verified {
				t.Fatalf("after the failover: %+v", res)
			}
		})
	}
}

// TestVerifyApertures: verify compares each aperture's file (the guest's
// memory) with the device copies while the guest holds its session. In off
// mode nothing the guest wrote after attaching reached either device copy
// (primary and standby are equally stale, and equal to each other): verify
// must still report the aperture, and repair must bring both to the file.
// A traced mode matches.
func TestVerifyApertures(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts and traces guest processes")
	}
	for _, mode := range []mmiotrace.Mode{mmiotrace.ModeOff, mmiotrace.ModePage} {
		t.Run(mode.String(), func(t *testing.T) {
			c, err := cluster.Start(cluster.Options{Replicate: true, StartStandby: true, Mode: replicate.ModeCommit,
				MMIO: &hypervisor.MMIOConfig{Mode: mode, Pin: true}})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			cmd := guestCommand("--addr", c.Endpoint, "--workload", "seq", "--writes", "3000", "--aperture-bytes", "65536", "--hold")
			out, _ := cmd.StdoutPipe()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { cmd.Process.Kill(); mmiotrace.WaitExit(cmd) }()
			sc := bufio.NewScanner(out)
			var res Result
			if !sc.Scan() || json.Unmarshal(sc.Bytes(), &res) != nil || res.Writes == 0 {
				t.Fatalf("guest said %q", sc.Text())
			}
			rep, err := c.Verify()
			if err != nil {
				t.Fatal(err)
			}
			if stale := mode == mmiotrace.ModeOff; rep.Match == stale || stale && (len(rep.Mismatches) != 1 || !rep.Mismatches[0].Repairable) {
				t.Fatalf("%s mode, the guest's aperture written: %+v", mode, rep)
			}
			if rep.Match {
				return
			}
			if rep, err = c.PrimaryNode.Verify(node.VerifyOptions{Repair: true}, 30*time.Second); err != nil || rep.Repaired != 1 {
				t.Fatalf("repair: %+v, %v", rep, err)
			}
			if rep, err = c.Verify(); err != nil || !rep.Match {
				t.Fatalf("after repair: %+v, %v", rep, err)
			}
		})
	}
}

// TestApertureWritesDuringResync: a standby joins while a guest process
// writes its apertures (the doorbell workload: ring descriptors and a
// register, a call each round). The resync's stream waits, after its
// second snapshot record, until the primary has logged 20 more aperture
// flushes, so they land between resync steps; the guest's device copies
// equal its apertures, and the standby is identical to the primary at
// the next log position.
func TestApertureWritesDuringResync(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts and traces a guest process")
	}
	mode := mmiotrace.ModeUffd
	if mmiotrace.UffdAvailable() != nil {
		mode = mmiotrace.ModePage
	}
	var c *cluster.Cluster
	var ready, interleaved atomic.Bool
	records := 0
	hook := func(m link.Message) bool {
		if !ready.Load() || m.From != link.FromPrimary || m.Type != "record" || !c.Sender.Status().Resync.Active {
			return true
		}
		if records++; records == 2 {
			before := mmioRecords(c)
			deadline := time.Now().Add(10 * time.Second)
			for mmioRecords(c) < before+20 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			interleaved.Store(mmioRecords(c) >= before+20)
		}
		return true
	}
	c, err := cluster.Start(cluster.Options{Replicate: true, Mode: replicate.ModeCommit, Faults: hook,
		MMIO: &hypervisor.MMIOConfig{Mode: mode, Pin: true, FlushEvery: 5_000_000}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	g, err := c.Guest("bulk") // memory enough for several snapshot records
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if p, err := g.Alloc(4 << 20); err != nil || g.CopyHtoD(p, make([]byte, 4<<20)) != nil {
		t.Fatal(err)
	}
	cmd := guestCommand("--addr", c.Endpoint, "--workload", "doorbell", "--writes", "50000", "--aperture-bytes", "262144")
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); mmioRecords(c) == 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	ready.Store(true)
	if err := c.StartStandby(); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitProtected(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	var res Result
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		json.Unmarshal(sc.Bytes(), &res)
	}
	if err := mmiotrace.WaitExit(cmd); err != nil {
		t.Fatal(err)
	}
	if !res.Verified || res.Calls == 0 {
		t.Fatalf("guest: %+v", res)
	}
	if !interleaved.Load() {
		t.Fatal("no aperture flushes landed between the resync's steps (the guest ended first?)")
	}
	rep, err := c.Verify()
	if err != nil || !rep.Match {
		t.Fatalf("standby after a resync under aperture writes: %+v, %v", rep, err)
	}
}

// mmioRecords counts the aperture flush records the primary logged.
func mmioRecords(c *cluster.Cluster) uint64 {
	var n uint64
	for _, s := range c.Primary.Status().Sessions {
		if s.MMIO != nil {
			n += s.MMIO.Records
		}
	}
	return n
}

// tappedSim is the software GPU, keeping the contexts it hands out so a
// test can write device memory behind the hypervisor's back: a lost write
// injected on one node.
type tappedSim struct {
	*sim.Backend
	mu   sync.Mutex
	ctxs []gpu.Context
}

func (b *tappedSim) NewContext(base, size uint64) (gpu.Context, error) {
	c, err := b.Backend.NewContext(base, size)
	if err == nil {
		b.mu.Lock()
		b.ctxs = append(b.ctxs, c)
		b.mu.Unlock()
	}
	return c, err
}

// loseWrite changes n bytes at off in the aperture at ptr on one node's
// device (its newest context: the guest's session), as a write the tracer
// lost there would leave them.
func (b *tappedSim) loseWrite(t *testing.T, ptr, off uint64, n int) {
	t.Helper()
	b.mu.Lock()
	ctx := b.ctxs[len(b.ctxs)-1]
	b.mu.Unlock()
	buf := make([]byte, n)
	if err := ctx.CopyDtoH(buf, ptr+off, 0); err != nil {
		t.Fatal(err)
	}
	for i := range buf {
		buf[i] ^= 0x5a
	}
	if err := ctx.CopyHtoD(ptr+off, buf, 0); err != nil {
		t.Fatal(err)
	}
}

// TestVerifyAperturesLostWrite: verify --apertures compares each
// aperture's file byte by byte with the device copy on each node. A write
// lost on the primary's copy only, then on the standby's only, must show
// on that side alone, with its byte count and first offset; repair brings
// both back to the file.
func TestVerifyAperturesLostWrite(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts and traces a guest process")
	}
	primary, standby := &tappedSim{Backend: sim.New(1 << 30)}, &tappedSim{Backend: sim.New(1 << 30)}
	c, err := cluster.Start(cluster.Options{Replicate: true, StartStandby: true, Mode: replicate.ModeCommit,
		NewBackend:        func() (gpu.Backend, error) { return primary, nil },
		NewStandbyBackend: func() (gpu.Backend, error) { return standby, nil },
		MMIO:              &hypervisor.MMIOConfig{Mode: mmiotrace.ModePage, Pin: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, stop := holdGuest(t, "--addr", c.Endpoint, "--workload", "seq", "--writes", "3000", "--aperture-bytes", "65536")
	defer stop()
	rep, err := c.Verify()
	if err != nil || !rep.Match || len(rep.Apertures) != 1 {
		t.Fatalf("before any injection: %+v, %v", rep, err)
	}
	ptr, err := strconv.ParseUint(rep.Apertures[0].ID, 0, 64)
	if err != nil || rep.Apertures[0].Size != 65536 {
		t.Fatalf("aperture %+v: %v", rep.Apertures[0], err)
	}
	for _, side := range []struct {
		name string
		gpu  *tappedSim
	}{{"primary", primary}, {"standby", standby}} {
		side.gpu.loseWrite(t, ptr, 4100, 3)
		rep, err := c.Verify()
		if err != nil || rep.Match || len(rep.Apertures) != 1 {
			t.Fatalf("write lost on the %s: %+v, %v", side.name, rep, err)
		}
		a := rep.Apertures[0]
		lost, kept := a.Primary, a.Standby
		if side.name == "standby" {
			lost, kept = kept, lost
		}
		if lost.MismatchedBytes != 3 || lost.FirstOffset != 4100 || !kept.Match() {
			t.Fatalf("write lost on the %s: verify --apertures says %+v", side.name, a)
		}
		t.Logf("write lost on the %s: %+v", side.name, a)
		if rep, err = c.PrimaryNode.Verify(node.VerifyOptions{Repair: true}, 30*time.Second); err != nil || rep.Repaired != 1 {
			t.Fatalf("repair: %+v, %v", rep, err)
		}
		if rep, err = c.Verify(); err != nil || !rep.Match || !rep.Apertures[0].Primary.Match() || !rep.Apertures[0].Standby.Match() {
			t.Fatalf("after repair: %+v, %v", rep, err)
		}
	}
}
