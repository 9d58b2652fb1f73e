package drill

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
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
	Mode                   string
	// Round1 ran on the primary; Round2 lost the primary after its first
	// workload (KilledAfter, at Killed) and finished on the standby.
	Round1, Round2 []workload.Result
	Round1Verified bool
	Round2Verified bool // verified, and equal to round 1
	KilledAfter    string
	Killed         time.Time
	// Checkpoint (epoch mode) is the epoch the demo cut, as a VM's
	// checkpointer would, once round 1 was done.
	Checkpoint  *Checkpoint
	StandbyRole string              // after round 2
	Promotion   *nodeproc.Promotion // the standby's, nil if it never took over
	Failovers   []pvdriver.Failover
	// Loss is the work the takeover lost, nil if it lost none.
	Loss *Loss
	// The aperture guest wrote mapped device memory across the kill.
	AperturePID int
	Aperture    mmioguest.Result
}

// Checkpoint is an epoch cut on the primary and committed on the standby.
type Checkpoint struct {
	Epoch uint64
	At    time.Time
}

// Loss is work a takeover lost: the guest was told that the new primary
// holds its session only up to an earlier request.
type Loss struct {
	Promise Promise
	// GuestView is what the guest was told; RolledBackTo is the last
	// request the new primary's copy of the session held, the point the
	// guest went back to.
	GuestView    string
	RolledBackTo uint64
	// Finished are round 2's workloads the guest had finished before the
	// fault, Interrupted the one under way when it was told: their work
	// after RolledBackTo was lost, and the guest ran round 2 again from
	// its start (Rerun).
	Finished    []string
	Interrupted string
	Rerun       bool
}

// Promise is what a replication mode lets a takeover lose.
type Promise struct {
	Mode string
	// MayLose: a takeover may roll a guest's session back, by design.
	MayLose bool
	What    string // the promise, in a sentence
}

// promises are the replication modes' (USAGE.md, "Modes").
var promises = map[string]Promise{
	"sync": {Mode: "sync", What: "every synchronous call returns only after the standby applied it, so a takeover loses nothing"},
	"commit": {Mode: "commit", What: "a reply that carries anything out to the guest waits until the standby applied everything before it, " +
		"and the guest resends what came after, so a takeover loses nothing"},
	"async": {Mode: "async", MayLose: true, What: "nothing waits for the standby, so a takeover loses what the standby had not yet applied"},
	"epoch": {Mode: "epoch", MayLose: true, What: "the standby applies an epoch only once the next one is cut (the VM's checkpoint), " +
		"so a takeover loses everything after the last cut"},
}

// PromiseOf is mode's promise.
func PromiseOf(mode string) Promise { return promises[mode] }

// Passed reports whether the guests finished on the promoted standby with
// verified results after exactly one failover each, having lost no work
// that the mode does not allow a takeover to lose.
func (r *DemoResult) Passed() bool {
	return r.Round2Verified && len(r.Failovers) == 1 && r.Aperture.Verified && r.Aperture.Failovers == 1 &&
		(r.Loss == nil || r.Loss.Promise.MayLose)
}

// Demo shows the product's point on one machine: it starts a standby and a
// primary as separate processes on loopback, runs every workload through a
// guest, SIGKILLs the primary in the middle of the second round, and the
// guest finishes on the promoted standby with verified results. In a mode
// that may lose work (async, epoch) a guest told that its session was
// rolled back goes back to where the new primary's copy of it ends and
// runs round 2 again; the result says what was lost. The result is nil
// when the demo could not run to the end; an error with a result means it
// ran but failed (a loss the mode does not allow, among others).
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
	res := &DemoResult{PrimaryPID: p.primary.Cmd.Process.Pid, StandbyPID: p.standby.Cmd.Process.Pid, Mode: o.Mode}
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
	err = res.rounds(c, p, o.Binary)
	if err != nil && res.Loss == nil {
		return nil, err
	}
	var sst struct {
		Role      string
		Promotion *nodeproc.Promotion
	}
	p.standby.Status(&sst)
	res.StandbyRole, res.Promotion, res.Failovers = sst.Role, sst.Promotion, c.Failovers()
	if keepLogs = err != nil || !res.Passed(); keepLogs {
		if err == nil {
			err = errors.New("the guests did not finish verified on the promoted standby")
		}
		return res, fmt.Errorf("failover demo failed: %w (logs in %s)", err, p.dir)
	}
	return res, nil
}

// rounds runs every workload twice through c, the second time killing the
// primary after the first workload, with an aperture guest writing across
// the kill. In epoch mode it cuts an epoch between the rounds, once the
// aperture guest has paused.
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
	if res.Mode == "epoch" {
		if err := res.checkpoint(p); err != nil {
			ap.resume()
			ap.result() // it finishes on the primary
			return err
		}
	}
	killAfterFirst := func(i int, r workload.Result) {
		if i == 0 {
			res.Killed, res.KilledAfter = time.Now(), r.Name
			p.primary.Cmd.Process.Kill()
			ap.resume()
		}
	}
	res.Round2, res.Round2Verified, err = runRound(c, ws, res.Round1, killAfterFirst)
	if err != nil {
		err = res.rollBack(c, ws, err)
	}
	var apErr error
	if res.Aperture, apErr = ap.result(); err == nil && apErr != nil {
		return fmt.Errorf("aperture guest: %w", apErr)
	}
	if err != nil {
		return fmt.Errorf("after the failover: %w", err)
	}
	return nil
}

// checkpoint cuts an epoch, as the VM's checkpointer would: everything
// before it is committed on the standby.
func (res *DemoResult) checkpoint(p *pair) error {
	epoch, committed, err := cutEpoch(p.primary)
	switch {
	case err != nil:
		return fmt.Errorf("cutting an epoch: %w", err)
	case !committed:
		return fmt.Errorf("epoch %d was cut but not committed on the standby", epoch)
	}
	res.Checkpoint = &Checkpoint{Epoch: epoch, At: time.Now()}
	return nil
}

// rollBack handles err, round 2's failure after the kill: a guest told
// that its session was rolled back goes back to where the new primary's
// copy ends (its own checkpoint: round 2's start) and runs round 2 again,
// if the mode allows the loss; any other error, or a loss the mode does
// not allow, is returned.
func (res *DemoResult) rollBack(c *pvdriver.Client, ws []workload.Workload, err error) error {
	if !errors.Is(err, pvdriver.ErrRolledBack) {
		return err
	}
	l := &Loss{Promise: PromiseOf(res.Mode), GuestView: err.Error()}
	for _, r := range res.Round2 {
		l.Finished = append(l.Finished, r.Name)
	}
	if len(res.Round2) < len(ws) {
		l.Interrupted = ws[len(res.Round2)].Name
	}
	res.Loss = l
	if !l.Promise.MayLose {
		return fmt.Errorf("a loss %s mode does not allow (%s): %w", res.Mode, l.Promise.What, err)
	}
	l.RolledBackTo, l.Rerun = c.AcceptRollback(), true
	res.Round2, res.Round2Verified, err = runRound(c, ws, res.Round1, nil)
	return err
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
