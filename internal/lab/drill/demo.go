package drill

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"

	"github.com/vgpuha/vgpuha/internal/lab/drill/nodeproc"
	"github.com/vgpuha/vgpuha/internal/lab/mmioguest"
	"github.com/vgpuha/vgpuha/internal/lab/workload"
	"github.com/vgpuha/vgpuha/mmiotrace"
	"github.com/vgpuha/vgpuha/pvdriver"
)

// DemoOptions configure the demo.
type DemoOptions struct {
	Binary  string // the vgpuha binary the agents and the aperture guest run from
	Backend string // GPU backend of both nodes
	Mode    string // replication mode
}

// DemoResult is what the demo saw.
type DemoResult struct {
	PrimaryPID, StandbyPID int
	Backend                string // the primary's
	// Round1 ran on the primary; Round2 lost the primary after its first
	// workload (KilledAfter, at Killed) and finished on the standby.
	Round1, Round2 []workload.Result
	Round1Verified bool
	Round2Verified bool // verified, and equal to round 1
	KilledAfter    string
	Killed         time.Time
	StandbyRole    string              // after round 2
	Promotion      *nodeproc.Promotion // the standby's, nil if it never took over
	Failovers      []pvdriver.Failover
	// The aperture guest wrote mapped device memory across the kill.
	AperturePID int
	Aperture    mmioguest.Result
}

// Passed reports whether the guests finished on the promoted standby with
// verified results after exactly one failover each.
func (r *DemoResult) Passed() bool {
	return r.Round2Verified && len(r.Failovers) == 1 && r.Aperture.Verified && r.Aperture.Failovers == 1
}

// Demo shows the product's point on one machine: it starts a standby and a
// primary as separate processes on loopback, runs every workload through a
// guest, SIGKILLs the primary in the middle of the second round, and the
// guest finishes on the promoted standby with verified results. The result
// is nil when the demo could not run to the end; an error with a result
// means it ran but failed.
func Demo(o DemoOptions) (*DemoResult, error) {
	p, err := startPair(o.Binary, o.Backend, o.Mode, false, "unix", nil, false)
	if err != nil {
		return nil, err
	}
	keepLogs := false
	defer func() {
		if keepLogs {
			p.stopKeepingLogs()
		} else {
			p.stop()
		}
	}()
	res := &DemoResult{PrimaryPID: p.primary.Cmd.Process.Pid, StandbyPID: p.standby.Cmd.Process.Pid}
	var pst struct{ Backend string }
	p.primary.Status(&pst)
	res.Backend = pst.Backend

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	c, err := pvdriver.Open(ctx, p.primaryEP, pvdriver.Options{GuestName: "demo", Failover: []string{p.standbyEP}})
	cancel()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if err := res.rounds(c, p, o.Binary); err != nil {
		return nil, err
	}
	var sst struct {
		Role      string
		Promotion *nodeproc.Promotion
	}
	p.standby.Status(&sst)
	res.StandbyRole, res.Promotion, res.Failovers = sst.Role, sst.Promotion, c.Failovers()
	if keepLogs = !res.Passed(); keepLogs {
		return res, fmt.Errorf("failover demo failed (logs in %s)", p.dir)
	}
	return res, nil
}

// rounds runs every workload twice through c, the second time killing the
// primary after the first workload, with an aperture guest writing across
// the kill.
func (res *DemoResult) rounds(c *pvdriver.Client, p *pair, bin string) error {
	ws, _ := workload.Select("all")
	var err error
	if res.Round1, res.Round1Verified, err = runRound(c, ws, nil, nil); err != nil {
		return err
	}
	// An aperture guest: a separate process that writes mapped device
	// memory directly (no calls); the primary traces those writes and
	// replicates them. It writes half, pauses across the kill, writes the
	// rest, and checks the device copy on whichever node serves it then.
	ap, err := startApertureGuest(bin, p.primaryEP, p.standbyEP)
	if err != nil {
		return err
	}
	res.AperturePID = ap.cmd.Process.Pid
	killAfterFirst := func(i int, r workload.Result) {
		if i == 0 {
			res.Killed, res.KilledAfter = time.Now(), r.Name
			p.primary.Cmd.Process.Kill()
			ap.resume()
		}
	}
	if res.Round2, res.Round2Verified, err = runRound(c, ws, res.Round1, killAfterFirst); err != nil {
		return fmt.Errorf("after the failover: %w", err)
	}
	if res.Aperture, err = ap.result(); err != nil {
		return fmt.Errorf("aperture guest: %w", err)
	}
	return nil
}

// runRound runs ws through c, calling after (if set) after each, and
// reports whether every result verified and equals want's (if set).
func runRound(c *pvdriver.Client, ws []workload.Workload, want []workload.Result, after func(int, workload.Result)) ([]workload.Result, bool, error) {
	var rs []workload.Result
	verified := true
	for i, w := range ws {
		r, err := w.Run(context.Background(), c, 0)
		if err != nil {
			return rs, false, err
		}
		if want != nil {
			r.Verified = r.Verified && r.Checksum == want[i].Checksum
		}
		rs = append(rs, r)
		verified = verified && r.Verified
		if after != nil {
			after(i, r)
		}
	}
	return rs, verified, nil
}

// apertureGuest is `vgpuha mmio-guest --workload failover` run by the demo.
type apertureGuest struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
}

// startApertureGuest starts the guest and waits until it has written its
// first half and paused.
func startApertureGuest(bin, primaryEP, standbyEP string) (*apertureGuest, error) {
	cmd := mmiotrace.GuestCommand(exec.Command(bin, "mmio-guest", "--addr", primaryEP, "--failover", standbyEP,
		"--workload", "failover", "--writes", "20000", "--aperture-bytes", "1048576"))
	cmd.Stderr = os.Stderr
	g := &apertureGuest{cmd: cmd}
	var err error
	if g.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	g.out = bufio.NewScanner(out)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	if !g.out.Scan() || g.out.Text() != `{"paused":true}` {
		mmiotrace.WaitExit(cmd)
		return nil, fmt.Errorf("aperture guest did not start: %q", g.out.Text())
	}
	return g, nil
}

// resume lets the guest write its second half.
func (g *apertureGuest) resume() { fmt.Fprintln(g.stdin) }

// result waits for the guest's report.
func (g *apertureGuest) result() (mmioguest.Result, error) {
	var res mmioguest.Result
	for g.out.Scan() {
		json.Unmarshal(g.out.Bytes(), &res)
	}
	return res, mmiotrace.WaitExit(g.cmd)
}
