package mmioguest

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/internal/cluster"
	"github.com/vgpuha/vgpuha/mmiotrace"
	"github.com/vgpuha/vgpuha/replicate"
)

// The guest runs as this test binary in its own process (and process
// group), as the tracer requires.
func TestMain(m *testing.M) {
	if args := os.Getenv("MMIOGUEST_ARGS"); args != "" {
		var a []string
		json.Unmarshal([]byte(args), &a)
		if err := Main(flag.NewFlagSet("mmio-guest", flag.ContinueOnError), a, os.Stdout); err != nil {
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
			if mode == mmiotrace.ModeUffd && mmiotrace.UffdAvailable() != nil {
				t.Skipf("uffd mode needs userfaultfd asynchronous write-protection (Linux 6.7+): %v", mmiotrace.UffdAvailable())
			}
			c, err := cluster.Start(cluster.Options{Replicate: true, StartStandby: true, Mode: replicate.ModeCommit,
				MMIO: &hypervisor.MMIOConfig{Mode: mode, Pin: true, FlushEvery: 5_000_000}})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			for _, w := range Workloads {
				res := runGuest(t, "--addr", c.Endpoint, "--workload", w, "--writes", "3000", "--aperture-bytes", "262144")
				if res.Mode != mode.String() || res.Writes == 0 {
					t.Fatalf("%s: %+v", w, res)
				}
				if res.Verified != (mode != mmiotrace.ModeOff) {
					t.Fatalf("%s in %s mode: device copy matches the guest's aperture: %v", w, mode, res.Verified)
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

// TestApertureSurvivesFailover kills the primary between two rounds of
// aperture writes. The guest resumes on the promoted standby, which takes
// the aperture over (re-attach) and starts from its current contents: the
// device copy there must equal everything the guest wrote, including what
// it wrote while no node was tracing it.
func TestApertureSurvivesFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts and traces guest processes")
	}
	for _, mode := range []mmiotrace.Mode{mmiotrace.ModeUffd, mmiotrace.ModePage} {
		t.Run(mode.String(), func(t *testing.T) {
			if mode == mmiotrace.ModeUffd && mmiotrace.UffdAvailable() != nil {
				t.Skipf("uffd mode needs userfaultfd asynchronous write-protection (Linux 6.7+): %v", mmiotrace.UffdAvailable())
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
			if err := c.WaitProtected(10 * time.Second); err != nil {
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
			if rep, err = c.PrimaryNode.Verify(true, 30*time.Second); err != nil || rep.Repaired != 1 {
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
	hook := func(m replicate.Message) bool {
		if !ready.Load() || m.From != replicate.FromPrimary || m.Type != "record" || !c.Sender.Status().Resync.Active {
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
