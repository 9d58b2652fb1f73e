package drill

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/vgpuha/vgpuha/internal/lab/drill/nodeproc"
	"github.com/vgpuha/vgpuha/pvdriver"
)

// fault is one row of the fault table: how to strike a running pair, and
// what must hold afterwards beyond what the drill checks for every row (the
// guest's counters equal a fault-free run's; it went through failovers
// failovers). Adding a fault is adding a row.
type fault struct {
	name, help string
	inject     func(*run) error
	expect     func(*run) error // nil: the drill's own checks only
	// takeover: the standby must be promoted; the drill measures its
	// detection and the time from the fault to a serving new primary.
	takeover bool
	// unplanned: a takeover nobody asked for, whose detection and guest
	// pause go into the report's quantiles.
	unplanned bool
	failovers int  // the guest's failovers afterwards, or anyFailovers
	rollback  bool // two nodes only: the guest may be told its session was rolled back
	// netns: two nodes need each in its own network namespace for it (a
	// coordinated pair cuts its proxies instead).
	netns  bool
	epoch  bool   // drilled in epoch mode too (a simulated VM checkpointer)
	setups setups // with two nodes alone, with a coordinator, or both
	// onRequest: drilled only when named (--faults), never by default
	// (the detector and etcd-stall rows, run as a set of their own).
	onRequest bool
}

// setups says where a row is drilled.
type setups uint8

const (
	twoNode setups = 1 << iota
	withCoordinator
	bothSetups = twoNode | withCoordinator
)

// anyFailovers: the row does not check how often the guest moved.
const anyFailovers = -1

// partitionOutlasts is how long a cut replication link stays cut after the
// standby took over: the old primary serves on alone meanwhile.
const partitionOutlasts = 100 * time.Millisecond

var faults = []fault{
	{name: "kill", help: "SIGKILL primary", inject: killPrimary,
		takeover: true, unplanned: true, failovers: 1, epoch: true, setups: bothSetups},
	{name: "freeze", help: "SIGSTOP primary, SIGCONT after the takeover", inject: freezePrimary, expect: thawedPrimaryFenced,
		takeover: true, unplanned: true, failovers: 1, setups: bothSetups},
	{name: "standby-kill", help: "SIGKILL standby", inject: killStandby,
		failovers: 0, setups: bothSetups},
	{name: "switchover", help: "planned", inject: switchover, expect: oldPrimaryFenced,
		takeover: true, failovers: 1, setups: bothSetups},
	// The guest resumes on the same primary; nobody takes over.
	{name: "guest-cut", help: "drop the guest's connections to the primary", inject: cutGuest, expect: standbyNotPromoted,
		failovers: 1, setups: bothSetups},
	{name: "partition", help: "cut the primary from the standby (and etcd) while its guest reaches it, heal after the takeover; two nodes need namespaces",
		inject: partition, expect: partitionFenced, takeover: true, failovers: anyFailovers, rollback: true, netns: true, setups: bothSetups},
	// The whole round trip: the old primary's host comes back as a
	// standby of the new primary, is resynced, and takes the role back.
	{name: "failback", help: "SIGKILL primary, rejoin its host as standby, switch back", inject: killPrimary, expect: failBack,
		takeover: true, failovers: 2, setups: twoNode},
	// A healthy primary is never deposed by its standby's own stall.
	{name: "standby-freeze", help: "SIGSTOP standby 600 ms", inject: freezeStandby(600 * time.Millisecond), expect: standbyNotPromoted,
		failovers: 0, setups: bothSetups},
	{name: "standby-freeze-2s", help: "SIGSTOP standby 2 s", inject: freezeStandby(2 * time.Second), expect: standbyNotPromoted,
		failovers: 0, setups: bothSetups},
	// New guests start on the promoted node: their endpoint list leads there.
	{name: "guest-start-after-failover", help: "SIGKILL primary, then start a new guest", inject: killPrimary, expect: newGuestServed,
		takeover: true, unplanned: true, failovers: 1, setups: bothSetups},
	// The primary is re-protected without an operator.
	{name: "standby-loss", help: "SIGKILL standby; a pool standby replaces it and is resynced (coordinator)", inject: killStandby, expect: poolStandbyProtects,
		failovers: 0, setups: withCoordinator},
	// etcd keeps a quorum: nothing may fail over.
	{name: "etcd-member-kill", help: "SIGKILL the etcd leader member (coordinator)", inject: killEtcdLeader, expect: nothingMoved,
		failovers: 0, setups: withCoordinator},
	// The detector's false promotions: silences shorter than its threshold
	// (about 270 ms) must promote nobody, a 600 ms one every time. A
	// blackout drops every packet of the replication link, heartbeats
	// included (two nodes: every packet on their veth dropped; coordinated: its
	// proxies stall, etcd's too); a freeze stops the primary.
	{name: "blackout-100ms", help: "drop every packet between primary and standby for 100 ms; two nodes need namespaces",
		inject: blackout(100 * time.Millisecond), expect: standbyNotPromoted, failovers: anyFailovers, netns: true, setups: bothSetups, onRequest: true},
	{name: "blackout-200ms", help: "drop every packet between primary and standby for 200 ms; two nodes need namespaces",
		inject: blackout(200 * time.Millisecond), expect: standbyNotPromoted, failovers: anyFailovers, netns: true, setups: bothSetups, onRequest: true},
	{name: "blackout-600ms", help: "drop every packet between primary and standby for 600 ms; two nodes need namespaces",
		inject: blackout(600 * time.Millisecond), expect: promotedOldFenced, takeover: true, failovers: anyFailovers, rollback: true, netns: true,
		setups: twoNode, onRequest: true},
	{name: "freeze-100ms", help: "SIGSTOP primary 100 ms", inject: freezeFor(100 * time.Millisecond), expect: standbyNotPromoted,
		failovers: anyFailovers, setups: bothSetups, onRequest: true},
	{name: "freeze-200ms", help: "SIGSTOP primary 200 ms", inject: freezeFor(200 * time.Millisecond), expect: standbyNotPromoted,
		failovers: anyFailovers, setups: bothSetups, onRequest: true},
	// The 600 ms rows are two nodes' only: a coordinated standby cannot win
	// while the primary's lease holds (much longer than 600 ms), so with a
	// coordinator such a silence promotes nobody, as the etcd-freeze row
	// checks for a longer one.
	// Two nodes: a primary thawed before its guest moved acknowledges the
	// guest's launches until it learns the new term (the two-node risk);
	// the guest is then told of the rollback.
	{name: "freeze-600ms", help: "SIGSTOP primary 600 ms", inject: freezeFor(600 * time.Millisecond), expect: promotedOldFenced,
		takeover: true, unplanned: true, failovers: anyFailovers, rollback: true, setups: twoNode, onRequest: true},
	// etcd stalls for less than the lease: the primary suspends and
	// resumes; nothing may fail over.
	{name: "etcd-freeze", help: "SIGSTOP every etcd member for 1.5 s, shorter than the lease (coordinator; --coordinator.ttl above 1.5s)",
		inject: freezeEtcd(etcdFreeze), expect: nothingMovedAfterFreeze, failovers: anyFailovers, setups: withCoordinator, onRequest: true},
}

// blackout cuts the replication link (and, coordinated, the primary's
// etcd paths) for d, measured from the command that cuts it to the one
// that restores it (the cut takes effect within a millisecond; confirming
// it with ip takes longer on a loaded host, and counts).
func blackout(d time.Duration) func(*run) error {
	return func(r *run) error {
		start := time.Now()
		if err := r.pair.partition(true); err != nil {
			return fmt.Errorf("cutting the link: %w", err)
		}
		time.Sleep(time.Until(start.Add(d))) // the fault itself
		return r.pair.partition(false)
	}
}

// freezeFor stops the primary for d.
func freezeFor(d time.Duration) func(*run) error {
	return func(r *run) error {
		r.pair.primary.Signal(syscall.SIGSTOP)
		time.Sleep(d) // the fault itself
		r.pair.primary.Signal(syscall.SIGCONT)
		return nil
	}
}

// etcdFreeze is how long the etcd-freeze row stops every member.
const etcdFreeze = 1500 * time.Millisecond

// nothingMovedAfterFreeze: once etcd ran again for etcdSettles, the
// primary serves and nobody took over.
func nothingMovedAfterFreeze(r *run) error {
	time.Sleep(time.Until(r.struck.Add(etcdFreeze + etcdSettles)))
	return nothingMoved(r)
}

// freezeEtcd stops every etcd member for d while the guest's workload
// goes on (its calls meet the primary suspended, then serving again).
func freezeEtcd(d time.Duration) func(*run) error {
	return func(r *run) error {
		etcd := r.pair.coord.etcd
		if err := etcd.SignalAll(syscall.SIGSTOP); err != nil {
			return err
		}
		go func() {
			time.Sleep(d) // the fault itself
			etcd.SignalAll(syscall.SIGCONT)
		}()
		return nil
	}
}

// promotedOldFenced: a silence past the detector's threshold promoted the
// standby, and the old primary, back, learned it and stopped serving.
func promotedOldFenced(r *run) error {
	if err := nodeproc.WaitFor(5*time.Second, func() bool { return r.pair.standby.Promotion() != nil }); err != nil {
		return errors.New("the standby did not take over")
	}
	if r.rec.Fenced = r.pair.primary.Fenced(10 * time.Second); !r.rec.Fenced {
		return errors.New("the old primary still serves after the takeover")
	}
	return nil
}

// freezeStandby stops the standby for d while the primary keeps sending.
func freezeStandby(d time.Duration) func(*run) error {
	return func(r *run) error {
		r.pair.standby.Signal(syscall.SIGSTOP)
		time.Sleep(d) // the fault itself: how long the standby stalls
		r.pair.standby.Signal(syscall.SIGCONT)
		return nil
	}
}

// newGuestStartsWithin bounds how long after a takeover a new guest, given
// the dead primary's endpoint first, waits to be served.
const newGuestStartsWithin = time.Second

// newGuestServed starts a guest after the takeover with the old primary's
// endpoint first and the standby's second: it must be served at once.
func newGuestServed(r *run) error {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	g, err := pvdriver.Open(ctx, r.pair.primaryEP, pvdriver.Options{GuestName: "late", Failover: []string{r.pair.standbyEP}})
	if err != nil {
		return fmt.Errorf("a guest starting after the takeover: %w", err)
	}
	defer g.Close()
	if _, err := g.Alloc(4096); err != nil {
		return fmt.Errorf("a guest starting after the takeover: %w", err)
	}
	if d := time.Since(start); d > newGuestStartsWithin {
		return fmt.Errorf("a guest starting after the takeover waited %v", d)
	}
	return nil
}

// lookup returns the row named name, nil if there is none.
func lookup(name string) *fault {
	for i := range faults {
		if faults[i].name == name {
			return &faults[i]
		}
	}
	return nil
}

// FaultHelp describes the faults for --faults: "kill (SIGKILL primary), ...".
func FaultHelp() string {
	var b strings.Builder
	for i, f := range faults {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s (%s)", f.name, f.help)
	}
	return b.String()
}

// faultNames lists the names of the rows that keep holds for.
func faultNames(keep func(*fault) bool) []string {
	var names []string
	for i := range faults {
		if keep(&faults[i]) {
			names = append(names, faults[i].name)
		}
	}
	return names
}

func killPrimary(r *run) error { return r.pair.primary.Cmd.Process.Kill() }

func freezePrimary(r *run) error { return r.pair.primary.Cmd.Process.Signal(syscall.SIGSTOP) }

func killStandby(r *run) error { return r.pair.standby.Cmd.Process.Kill() }

func cutGuest(r *run) error {
	r.proxy.Cut()
	return nil
}

// switchover asks the primary to hand over while the guest keeps going.
func switchover(r *run) error {
	go r.pair.primary.Post("/switchover", 30*time.Second)
	return nil
}

// partition cuts the primary's paths but its guests' and heals them once
// the standby has taken over (or given up waiting for that).
func partition(r *run) error {
	if err := r.pair.partition(true); err != nil {
		return fmt.Errorf("cutting the link: %w", err)
	}
	go func() {
		nodeproc.WaitFor(5*time.Second, func() bool { return r.pair.standby.Promotion() != nil })
		time.Sleep(partitionOutlasts)
		r.pair.partition(false)
	}()
	return nil
}

// standbyReplacedWithin bounds how long after losing its standby a
// coordinated primary is protected by the pool's (the drill's standby
// timeout is 1 s; the rest is the resync), plus the resync of any large
// state.
const standbyReplacedWithin = 10 * time.Second

// poolStandbyProtects: the primary took the pool standby and is protected
// by it again; nobody took over.
func poolStandbyProtects(r *run) error {
	var st struct {
		Replication struct{ State, Peer string }
	}
	want := "tcp://" + r.pair.coord.poolAddr
	err := nodeproc.WaitFor(standbyReplacedWithin+resyncTime(r.rec.StateBytes), func() bool {
		return r.pair.primary.Status(&st) == nil && st.Replication.State == "protected" &&
			strings.TrimPrefix(st.Replication.Peer, "tcp://") == strings.TrimPrefix(want, "tcp://")
	})
	if err != nil {
		return fmt.Errorf("the pool standby never protected the primary (replication %+v): %w", st.Replication, err)
	}
	r.rec.ReprotectedMS = float64(time.Since(r.struck).Microseconds()) / 1000
	if r.pair.pool.Promotion() != nil || r.pair.primary.Fenced(0) {
		return errors.New("a node took over, or the primary stopped, while only its standby was lost")
	}
	return nil
}

// killEtcdLeader kills the member leading etcd's raft.
func killEtcdLeader(r *run) error {
	i, err := r.pair.coord.etcd.Leader()
	if err != nil {
		return err
	}
	return r.pair.coord.etcd.Kill(i)
}

// etcdSettles is how long after an etcd member died the drill checks
// that nothing moved: two leases.
const etcdSettles = 2 * time.Second

// nothingMoved: etcd lost a member and kept its quorum; the primary still
// serves and nobody took over.
func nothingMoved(r *run) error {
	time.Sleep(time.Until(r.struck.Add(etcdSettles)))
	if r.pair.primary.Fenced(0) {
		return errors.New("the primary stopped serving although etcd kept its quorum")
	}
	if r.pair.standby.Promotion() != nil || r.pair.pool.Promotion() != nil {
		return errors.New("a standby took over although the primary was healthy")
	}
	return nil
}

// thawedPrimaryFenced thaws the frozen primary, which must learn the newer
// term and stop serving instead of acting as a second primary.
func thawedPrimaryFenced(r *run) error {
	r.pair.primary.Signal(syscall.SIGCONT)
	if r.rec.Fenced = r.pair.primary.Fenced(5 * time.Second); !r.rec.Fenced {
		return errors.New("thawed primary was not fenced")
	}
	return nil
}

func oldPrimaryFenced(r *run) error {
	if r.rec.Fenced = r.pair.primary.Fenced(0); !r.rec.Fenced {
		return errors.New("old primary still serving after the switchover")
	}
	return nil
}

// failBack brings the old primary's host back as a standby of the promoted
// node, waits until it is resynced, and switches the primary role back to
// it; the guest follows (its failover list leads there).
func failBack(r *run) error {
	r.serving.end() // the old primary's endpoint is the rejoined node's from now on
	if err := r.pair.rejoin(); err != nil {
		return fmt.Errorf("rejoining the old primary's host: %w", err)
	}
	if err := waitResynced(r.pair.standby, r.rec.StateBytes, r.note); err != nil {
		return fmt.Errorf("the rejoined standby: %w", err)
	}
	if _, err := r.pair.standby.Post("/switchover", 30*time.Second); err != nil {
		return fmt.Errorf("switching back: %w", err)
	}
	if nodeproc.WaitFor(5*time.Second, func() bool { return r.pair.rejoined.Promotion() != nil }) != nil {
		return errors.New("the rejoined host did not take the primary role back")
	}
	if r.rec.Fenced = r.pair.standby.Fenced(5 * time.Second); !r.rec.Fenced {
		return errors.New("the node that switched back still serves")
	}
	return nil
}

// promotionSettles is how long after a fault that must not promote the
// drill waits before it checks: twice a detector's threshold, so that a
// promotion the fault's silence started has happened.
const promotionSettles = 600 * time.Millisecond

func standbyNotPromoted(r *run) error {
	time.Sleep(promotionSettles)
	if r.pair.standby.Promotion() != nil {
		return fmt.Errorf("the standby took over after %s", r.fault.help)
	}
	return nil
}

// partitionFenced: with a coordinator the old primary must have stopped
// before the standby served (the drill checks that for every row), and
// the guest lost nothing. The two-node case: the standby took over while
// the old primary, cut off, served the guest on unprotected. Once the link
// heals the old primary must learn the newer term and stop; the guest then
// moves to the new primary and must be told that what it did during the
// partition is not there (never lose it silently) — unless commit mode
// held its replies while the standby was unreachable, so that it forgot
// nothing and the drill's comparison finds every launch on the new primary.
func partitionFenced(r *run) error {
	if r.rec.Fenced = r.pair.primary.Fenced(10 * time.Second); !r.rec.Fenced {
		return errors.New("the old primary was not fenced after the partition healed")
	}
	if r.pair.coord != nil {
		return nil
	}
	if r.rolledBack {
		return nil
	}
	err := r.guest.Synchronize()
	if errors.Is(err, pvdriver.ErrRolledBack) {
		r.rolledBack = true
		return nil
	}
	if err != nil {
		return fmt.Errorf("after the partition: %w", err)
	}
	return nil
}
