// Package drill runs fault drills against a pair of vgpuha agent processes
// (a primary and a standby started from the vgpuha binary, on loopback or
// each in its own network namespace) under a guest workload, and the demo
// on the same pair. A drill iteration is the same for every fault: start
// the pair, run the workload, strike with the fault table's row at a
// chosen launch, check what the row expects, and compare the guest's
// results with a fault-free run's. The agents are separate processes,
// reached through their flags and admin endpoints only (package
// nodeproc); a coordinated pair adds an etcd cluster of member processes
// (package etcdproc). The kill soak is package soak.
package drill

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vgpuha/vgpuha/internal/lab/drill/nodeproc"
	"github.com/vgpuha/vgpuha/internal/lab/faultnet"
	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/replicate"
)

// Options configure a drill.
type Options struct {
	Binary  string // the vgpuha binary the agents run from
	Backend string // GPU backend of both nodes
	Mode    string // replication mode
	Netns   bool   // each node in its own network namespace, veth between (two nodes)
	// Coordinator: roles are decided in etcd (a 3-member cluster the drill
	// starts, on loopback; see coordpair.go) instead of by two nodes.
	Coordinator bool
	// CoordinatorTTL is every coordinated node's lease (whole seconds).
	CoordinatorTTL time.Duration
	// SideBySide (with Coordinator): each iteration is run again by two
	// nodes alone where they can drill its fault, for comparison.
	SideBySide bool
	// Faults are cycled through, one per iteration; empty: every fault
	// the mode and topology allow.
	Faults     []string
	Iterations int
	Seed       uint64 // seeds the launches at which faults strike
	// Transport is the guest's: unix (default, through a proxy) or shm
	// (shared memory, straight to the node; transport.go).
	Transport string
	// Progress, if set, is called after each iteration.
	Progress func(r Record, iterations int)
	// StateBytes (a multiple of 1 MiB): the drill's guest also holds this
	// much device memory, filled with a pattern, while the faults strike,
	// and reads every byte back after each iteration (state.go). Two
	// nodes: the primary starts alone, the guest fills its state, and the
	// standby joins and is resynced before the workload; with a
	// coordinator the fill is replicated as it happens.
	StateBytes uint64
	// Note, if set, is told what a long step is doing (the fill, a
	// resync's progress).
	Note func(string)
	// Detector is the standbys' failure detector (fixed or phi; "": the
	// node's default).
	Detector string
	// Stop, when closed (SIGTERM), ends the drill at the next launch or
	// between iterations; the iteration under way cleans up its processes,
	// namespaces and directory as usual, and Run returns ErrInterrupted
	// with the iterations that finished.
	Stop <-chan struct{}
}

func (o Options) detectorFlags() []string {
	if o.Detector == "" {
		return nil
	}
	return []string{"--failover.detector", o.Detector}
}

// ErrInterrupted: the drill was stopped before its last iteration.
var ErrInterrupted = errors.New("drill interrupted")

func (o Options) stopped() bool { return stopped(o.Stop) }

func (o Options) note(s string) {
	if o.Note != nil {
		o.Note(s)
	}
}

// stopped reports whether stop is closed (an interrupted drill cleans up
// everything, logs included).
func stopped(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	default:
		return false
	}
}

// Record is one drill iteration.
type Record struct {
	Iteration   int    `json:"iteration"`
	Fault       string `json:"fault"`
	Coordinated bool   `json:"coordinated"`
	AtLaunch    int    `json:"at_launch"`
	Passed      bool   `json:"passed"`
	Failovers   int    `json:"failovers"`
	// A takeover's spans (spans.go says what each measures): silence,
	// detection, promotion, takeover (from the fault).
	SilenceMS   float64 `json:"silence_ms,omitempty"`
	DetectionMS float64 `json:"detection_ms,omitempty"`
	PromotionMS float64 `json:"promotion_ms,omitempty"`
	TakeoverMS  float64 `json:"takeover_ms,omitempty"`
	// PauseMS is the guest pause of its first failover, which began
	// PauseFromMS after the fault (negative: a call made just before it).
	PauseMS     float64 `json:"pause_ms,omitempty"`
	PauseFromMS float64 `json:"pause_from_ms,omitempty"`
	// GuestLooks: the rounds in which the guest asked the nodes for its
	// session on its first failover (more than one: it was looking before
	// the new node served); GuestStalled: it went looking because a call
	// waited on a node whose connection stayed open (freeze, partition),
	// not because the connection ended.
	GuestLooks   int   `json:"guest_looks,omitempty"`
	GuestStalled bool  `json:"guest_stalled,omitempty"`
	LostRequests int64 `json:"lost_requests"` // negative: applied twice
	Fenced       bool  `json:"old_primary_fenced,omitempty"`
	// Promoted: a standby took over (asked for or not: a row without a
	// takeover that promotes is a false promotion).
	Promoted bool `json:"promoted"`
	// RolledBack: the guest was told its session was rolled back (a
	// partition: the old primary served on, unprotected, and was fenced).
	RolledBack bool `json:"rolled_back,omitempty"`
	// BothServingMS is how long the old primary answered guests after
	// another node had begun to (see servingProbe), from BothServingFromMS
	// after the fault.
	BothServingMS     float64 `json:"both_serving_ms"`
	BothServingFromMS float64 `json:"both_serving_from_ms,omitempty"`
	// ReprotectedMS: standby-loss, from the loss until the pool standby
	// protected the primary.
	ReprotectedMS float64 `json:"reprotected_ms,omitempty"`
	// StateBytes the guest held; BytesVerified of them read back equal
	// after the iteration.
	StateBytes    uint64 `json:"state_bytes"`
	BytesVerified uint64 `json:"bytes_verified"`
	Problem       string `json:"problem,omitempty"`
}

// Quantiles summarize a measurement over iterations.
type Quantiles struct {
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// Report is a whole drill.
type Report struct {
	Topology   string `json:"topology"`
	Mode       string `json:"mode"`
	StateBytes uint64 `json:"state_bytes"` // device memory the guest held
	// BytesVerified sums every iteration's state read back equal.
	BytesVerified uint64    `json:"bytes_verified"`
	Iterations    int       `json:"iterations"`
	Passed        int       `json:"passed"`
	Failed        int       `json:"failed"`
	LostRequests  int64     `json:"lost_requests"`
	DetectionMS   Quantiles `json:"detection_ms"` // unplanned takeovers (kill, freeze)
	TakeoverMS    Quantiles `json:"takeover_ms"`  // unplanned takeovers (kill, freeze)
	PauseMS       Quantiles `json:"pause_ms"`     // unplanned takeovers (kill, freeze)
	// Faults sums up each fault in each setup, in the order first drilled.
	Faults  []FaultSummary `json:"faults"`
	Records []Record       `json:"records"`
}

// FaultSummary is one fault in one setup over its iterations.
type FaultSummary struct {
	Fault         string    `json:"fault"`
	Coordinated   bool      `json:"coordinated"`
	Iterations    int       `json:"iterations"`
	Passed        int       `json:"passed"`
	LostRequests  int64     `json:"lost_requests"`
	Promotions    int       `json:"promotions"`      // iterations in which a standby took over
	DetectionMS   Quantiles `json:"detection_ms"`    // iterations with a takeover
	TakeoverMS    Quantiles `json:"takeover_ms"`     // iterations with a takeover
	PauseMS       Quantiles `json:"pause_ms"`        // iterations where the guest moved
	BothServingMS Quantiles `json:"both_serving_ms"` // every iteration
}

// Topology describes where the pair runs.
func Topology(netns bool) string {
	if netns {
		return "primary and standby in their own network namespaces, veth between"
	}
	return "processes on loopback (no network namespaces here: link partitions are not drilled)"
}

// coordinatedTopology describes a coordinated pair.
const coordinatedTopology = "coordinated: 3 etcd members, primary, standby and a pool standby as processes on loopback, " +
	"the primary's replication and etcd paths through proxies"

// Topology describes where o's pairs run.
func (o Options) Topology() string {
	switch {
	case o.SideBySide:
		return coordinatedTopology + "; two nodes: " + Topology(o.Netns)
	case o.Coordinator:
		return coordinatedTopology
	}
	return Topology(o.Netns)
}

// faults returns the faults to cycle through.
func (o Options) faults() []string {
	if len(o.Faults) > 0 {
		return o.Faults
	}
	return faultNames(func(f *fault) bool { return !f.onRequest && o.allows(f, o.Coordinator) })
}

// allows reports whether f can be drilled in o's mode and topology, with a
// coordinator or by two nodes.
func (o Options) allows(f *fault, coordinated bool) bool {
	if coordinated {
		return f.setups&withCoordinator != 0
	}
	return f.setups&twoNode != 0 && (o.Mode != "epoch" || f.epoch) && (o.Netns || !f.netns) &&
		(o.transport() != TransportShm || f.overShm())
}

// Validate refuses, before any iteration, an unknown mode and faults that
// are unknown or that the mode or topology cannot drill; the error names
// the valid ones.
func (o Options) Validate() error {
	if _, err := replicate.ParseMode(o.Mode); err != nil {
		return err
	}
	if err := o.validTransport(); err != nil {
		return err
	}
	switch {
	case o.SideBySide && !o.Coordinator:
		return errors.New("--side-by-side compares with --coordinator: give both")
	case o.Coordinator && o.Mode == "epoch":
		return errors.New("--coordinator is not drilled in epoch mode (valid there: sync, commit)")
	case o.Coordinator && (o.CoordinatorTTL < time.Second || o.CoordinatorTTL%time.Second != 0):
		return fmt.Errorf("--coordinator.ttl %v: want whole seconds, at least 1s", o.CoordinatorTTL)
	case o.StateBytes%stateChunk != 0:
		return errStateSize
	}
	for _, name := range o.faults() {
		f := lookup(name)
		switch {
		case f == nil:
			return fmt.Errorf("unknown fault %q (valid: %s)", name, strings.Join(faultNames(func(*fault) bool { return true }), ", "))
		case o.Coordinator && f.setups&withCoordinator == 0:
			return fmt.Errorf("fault %q is not drilled with --coordinator (valid there: %s)", name,
				strings.Join(faultNames(func(f *fault) bool { return f.setups&withCoordinator != 0 }), ", "))
		case o.Coordinator:
		case f.setups&twoNode == 0:
			return fmt.Errorf("fault %q needs --coordinator", name)
		case o.Mode == "epoch" && !f.epoch:
			return fmt.Errorf("fault %q is not drilled in epoch mode (valid there: %s)", name, strings.Join(faultNames(func(f *fault) bool { return f.epoch }), ", "))
		case f.netns && !o.Netns:
			return fmt.Errorf("fault %q needs network namespaces, and this drill runs on loopback", name)
		}
	}
	return nil
}

// Run drills o.Iterations times, cycling through the faults, each striking
// at a launch drawn from o.Seed; with o.SideBySide each iteration is
// followed by the same fault at the same launch with two nodes alone,
// where they can drill it.
func Run(o Options) (Report, error) {
	if err := o.Validate(); err != nil {
		return Report{}, err
	}
	names := o.faults()
	rng := rand.New(rand.NewPCG(o.Seed, o.Seed^0x9e3779b97f4a7c15))
	var recs []Record
	for i := 0; i < o.Iterations; i++ {
		at := 60 + rng.IntN(280)
		f := lookup(names[i%len(names)])
		for _, coordinated := range []bool{o.Coordinator, false} {
			if o.stopped() {
				return summarize(o, recs), ErrInterrupted
			}
			rec := once(o, f, at, coordinated)
			rec.Iteration = i + 1
			if o.stopped() {
				return summarize(o, recs), ErrInterrupted
			}
			recs = append(recs, rec)
			if o.Progress != nil {
				o.Progress(rec, o.Iterations)
			}
			if !coordinated || !o.SideBySide || !o.allows(f, false) {
				break
			}
		}
	}
	return summarize(o, recs), nil
}

// summarize totals the records.
func summarize(o Options, recs []Record) Report {
	rep := Report{Topology: o.Topology(), Mode: o.Mode, StateBytes: o.StateBytes, Records: recs}
	var det, takeover, pause []float64
	for _, r := range recs {
		rep.Iterations++
		if r.Passed {
			rep.Passed++
		} else {
			rep.Failed++
		}
		rep.LostRequests += max(r.LostRequests, -r.LostRequests)
		rep.BytesVerified += r.BytesVerified
		// The quantiles describe unplanned takeovers; a switchover or a
		// guest's own blip has nothing to detect and pauses far less.
		if f := lookup(r.Fault); r.Failovers > 0 && f != nil && f.unplanned {
			pause = append(pause, r.PauseMS)
			det, takeover = append(det, r.DetectionMS), append(takeover, r.TakeoverMS)
		}
	}
	rep.DetectionMS, rep.TakeoverMS, rep.PauseMS = QuantilesOf(det), QuantilesOf(takeover), QuantilesOf(pause)
	rep.Faults = summarizeFaults(recs)
	return rep
}

// summarizeFaults sums up each fault in each setup.
func summarizeFaults(recs []Record) []FaultSummary {
	type key struct {
		fault       string
		coordinated bool
	}
	var order []key
	type samples struct{ det, takeover, pause, both []float64 }
	sums, vals := map[key]*FaultSummary{}, map[key]*samples{}
	for _, r := range recs {
		k := key{r.Fault, r.Coordinated}
		if sums[k] == nil {
			sums[k], vals[k] = &FaultSummary{Fault: r.Fault, Coordinated: r.Coordinated}, &samples{}
			order = append(order, k)
		}
		s, v := sums[k], vals[k]
		s.Iterations++
		if r.Passed {
			s.Passed++
		}
		s.LostRequests += max(r.LostRequests, -r.LostRequests)
		if r.Promoted {
			s.Promotions++
		}
		if r.TakeoverMS > 0 {
			v.det, v.takeover = append(v.det, r.DetectionMS), append(v.takeover, r.TakeoverMS)
		}
		if r.Failovers > 0 {
			v.pause = append(v.pause, r.PauseMS)
		}
		v.both = append(v.both, r.BothServingMS)
	}
	out := make([]FaultSummary, 0, len(order))
	for _, k := range order {
		s, v := sums[k], vals[k]
		s.DetectionMS, s.TakeoverMS, s.PauseMS, s.BothServingMS = QuantilesOf(v.det), QuantilesOf(v.takeover), QuantilesOf(v.pause), QuantilesOf(v.both)
		out = append(out, *s)
	}
	return out
}

// QuantilesOf summarizes v (the drill's and the soak's figures).
func QuantilesOf(v []float64) Quantiles {
	if len(v) == 0 {
		return Quantiles{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	at := func(q float64) float64 { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return Quantiles{P50: at(0.5), P99: at(0.99), Max: s[len(s)-1]}
}

// run is one drill iteration.
type run struct {
	fault *fault
	rec   Record
	pair  *pair
	// proxy carries the guest's connections to the primary, so that they
	// can be cut (guest-cut).
	proxy      *faultnet.Proxy
	guest      *pvdriver.Client
	ctr        *counters
	ckpt       *checkpointer // epoch mode only
	state      *state        // with Options.StateBytes
	serving    *servingProbe // when each node answered guests
	struck     time.Time     // when the fault was injected
	rolledBack bool          // the guest was told its session was rolled back
	stop       <-chan struct{}
	note       func(string)
}

// once is one iteration: f strikes at launch at of a fresh pair's workload,
// coordinated or by two nodes.
func once(o Options, f *fault, at int, coordinated bool) Record {
	r := &run{fault: f, rec: Record{Fault: f.name, AtLaunch: at, Coordinated: coordinated, StateBytes: o.StateBytes}, stop: o.Stop, note: o.note}
	if o.Mode == "epoch" {
		// Strike right after a synchronization, before the checkpointer's
		// cut: the standby must discard that uncommitted epoch.
		r.rec.AtLaunch = at/epochEvery*epochEvery + epochEvery - 1
	}
	err := r.setUp(o, coordinated)
	if err == nil {
		err = r.workload()
	}
	if err == nil {
		err = r.check()
	}
	if err == nil {
		err = r.verifyState()
	}
	r.rec.RolledBack = r.rolledBack
	if r.pair != nil {
		r.rec.Promoted = r.pair.standby.Promotion() != nil || (r.pair.pool != nil && r.pair.pool.Promotion() != nil)
	}
	if r.guest != nil {
		r.rec.noteFailovers(r.guest.Failovers(), r.struck)
	}
	if err != nil {
		r.rec.Problem = err.Error()
	} else {
		r.rec.Passed = true
	}
	r.tearDown()
	return r.rec
}

// setUp starts the pair and a guest with the workload's state loaded.
func (r *run) setUp(o Options, coordinated bool) error {
	var err error
	flags, standbyLater := stateFlags(o.StateBytes), o.StateBytes > 0
	if coordinated {
		r.pair, err = startCoordinatedPair(o.Binary, o.Backend, o.Mode, o.CoordinatorTTL, flags, o.detectorFlags()...)
	} else {
		r.pair, err = startPair(o.Binary, o.Backend, o.Mode, o.Netns, guestScheme(o.transport()), flags, standbyLater, o.detectorFlags()...)
	}
	if err != nil {
		return err
	}
	guestEP := r.pair.primaryEP
	if o.transport() == TransportUnix {
		guestEP = "unix://" + filepath.Join(r.pair.dir, "guest-proxy.sock")
		if r.proxy, err = faultnet.Listen(guestEP, r.pair.primaryEP); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	r.guest, err = pvdriver.Open(ctx, guestEP, pvdriver.Options{GuestName: "drill", Failover: []string{r.pair.standbyEP}})
	cancel()
	if err != nil {
		return err
	}
	if o.Mode == "epoch" {
		r.ckpt = &checkpointer{primary: r.pair.primary}
	}
	if r.ctr, err = newCounters(r.guest); err != nil {
		return err
	}
	if err := r.holdState(o, standbyLater && !coordinated); err != nil {
		return err
	}
	r.serving = watch(r.pair.servingEndpoints()...)
	return nil
}

// holdState fills the guest's large state, if the drill has one; with
// join, the pair's standby then joins and the drill waits for its resync.
func (r *run) holdState(o Options, join bool) error {
	if o.StateBytes == 0 {
		return nil
	}
	var err error
	if r.state, err = fillState(r.guest, o.StateBytes, o.Seed+uint64(r.rec.AtLaunch), r.note); err != nil {
		return err
	}
	if !join {
		return nil
	}
	if err := r.pair.startStandby(); err != nil {
		return err
	}
	return waitResynced(r.pair.primary, o.StateBytes, r.note)
}

// verifyState reads the guest's large state back, wherever it now runs;
// a guest told of a rollback with no checkpoint to restore has nothing
// the drill could compare with.
func (r *run) verifyState() error {
	if r.state == nil || r.rolledBack && r.ckpt == nil {
		return nil
	}
	var err error
	r.rec.BytesVerified, err = r.state.verify()
	return err
}

// tearDown stops everything the iteration started; a failed iteration's
// logs stay, and its record says where.
func (r *run) tearDown() {
	if r.serving != nil {
		r.serving.end()
	}
	if r.guest != nil {
		r.guest.Close()
	}
	if r.proxy != nil {
		r.proxy.Close()
	}
	switch {
	case r.pair == nil:
	case r.rec.Problem != "" && !stopped(r.stop):
		r.pair.stopKeepingLogs() // the nodes' logs say why
		r.rec.Problem += " (logs in " + r.pair.dir + ")"
	default:
		r.pair.stop()
	}
}

// strike injects the fault.
func (r *run) strike() error {
	r.struck = time.Now()
	return r.fault.inject(r)
}

// workload runs the launches, striking at r.rec.AtLaunch: before that
// launch, or in epoch mode between its synchronization and the
// checkpointer's cut. It ends early, without an error, when the guest is
// told of a rollback that the row or the checkpointer accounts for.
func (r *run) workload() error {
	every := syncEvery
	if r.ckpt != nil {
		every = epochEvery
	}
	for i := 0; i < launches; i++ {
		select {
		case <-r.stop:
			return ErrInterrupted
		default:
		}
		if i == r.rec.AtLaunch && r.ckpt == nil {
			if err := r.strike(); err != nil {
				return err
			}
		}
		err := r.ctr.launch()
		if err == nil && i%every == every-1 {
			err = r.guest.Synchronize()
			if err == nil && r.ckpt != nil {
				if i == r.rec.AtLaunch {
					if err := r.strike(); err != nil {
						return err
					}
				}
				r.ckpt.cut(i + 1)
			}
		}
		if errors.Is(err, pvdriver.ErrRolledBack) && (r.fault.rollback && r.pair.coord == nil || r.ckpt != nil) {
			r.rolledBack = true
			return nil
		}
		if err != nil {
			return fmt.Errorf("launch %d: %w", i, err)
		}
	}
	return nil
}

// check holds the pair and the guest to what the row promises: a takeover
// where it causes one, the row's own expectations, the fault-free result,
// and the guest's failovers.
func (r *run) check() error {
	if r.fault.takeover {
		var p *nodeproc.Promotion
		if nodeproc.WaitFor(5*time.Second, func() bool { p = r.pair.standby.Promotion(); return p != nil }) != nil {
			return errors.New("standby was not promoted")
		}
		r.rec.noteTakeover(p, r.struck)
	}
	if r.fault.expect != nil {
		if err := r.fault.expect(r); err != nil {
			return err
		}
	}
	if err := r.compare(); err != nil {
		return err
	}
	r.serving.end()
	eps := r.pair.servingEndpoints()
	from, both := r.serving.overlap(eps[0], eps[1:]...)
	if both > 0 {
		r.rec.BothServingMS, r.rec.BothServingFromMS = MS(both), MS(from.Sub(r.struck))
	}
	if both > 0 && r.pair.coord != nil {
		return fmt.Errorf("the old primary answered guests %v after another node had begun to", both)
	}
	if got, want := len(r.guest.Failovers()), r.fault.failovers; want != anyFailovers && got != want {
		return fmt.Errorf("%d failovers, want %d", got, want)
	}
	return nil
}

// compare checks the guest's counters against a fault-free run: every
// launch the guest made is there exactly once, or, rolled back in epoch
// mode, every launch of the checkpoint its VM is restored to.
func (r *run) compare() error {
	want := int64(launches)
	switch {
	case r.rolledBack && r.ckpt != nil:
		r.guest.AcceptRollback() // the VM is restored from its last checkpoint
		want = int64(r.ckpt.journal)
	case r.rolledBack:
		return nil // told explicitly, nothing lost silently: no journal to compare with
	case r.ckpt != nil && r.fault.takeover:
		return fmt.Errorf("the %s never caused a rollback", r.fault.name)
	}
	total, err := r.ctr.count()
	if errors.Is(err, pvdriver.ErrRolledBack) && r.fault.rollback && r.pair.coord == nil {
		r.rolledBack = true // found out only now: the guest's last launches went to the deposed node
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading counters: %w", err)
	}
	if r.rec.LostRequests = want - total; r.rec.LostRequests == 0 {
		return nil
	}
	if r.rolledBack {
		return fmt.Errorf("GPU holds %d launches, the restored VM's journal %d", total, want)
	}
	return fmt.Errorf("counters off by %d launches", r.rec.LostRequests)
}
