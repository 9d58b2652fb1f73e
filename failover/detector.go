// Package failover decides when a standby stops believing in its primary,
// and who may serve: it owns the failure detectors and the role logic
// (Node: standby, primary, suspended, fenced; terms; the fencing rule), deterministic
// and golden-tested (testdata/detector, testdata/roles). It does no I/O:
// the standby agent acts on its decisions (fence the old link, serve
// guests) and the replication link carries terms between nodes (a promoted
// standby answers a returning primary with its term).
//
// Detectors are deterministic: they never read the clock themselves, every
// method takes the time (as etcd-io/raft's Tick does), so tests drive them
// with made-up times.
//
// What two nodes alone can promise: a standby that stops hearing its primary
// cannot tell a dead primary from a cut link. It promotes, and the old
// primary, if alive, keeps serving its guests until it learns of the new
// term (when its replication link reconnects and is answered with it). In
// that window both may serve different guests; no guest is served by both
// (a guest resumes on the node with the highest term it can reach), but a
// guest left on the old primary continues on state the new primary does not
// see. An external lease (etcd, fed in as events by the node's
// coordinator) closes that window; lease.go says how a coordinated
// primary that loses its lease suspends, and resumes or fences.
package failover

import (
	"fmt"
	"math"
	"time"
)

// Detector turns heartbeat arrival times into a verdict.
type Detector interface {
	// Heartbeat records that the primary was heard from at t.
	Heartbeat(t time.Time)
	// Suspect reports whether, at t, the primary should be presumed dead.
	Suspect(t time.Time) bool
}

// Fixed suspects the primary once nothing was heard for Timeout.
type Fixed struct {
	Timeout time.Duration
	last    time.Time
}

// Heartbeat implements Detector.
func (f *Fixed) Heartbeat(t time.Time) {
	if t.After(f.last) {
		f.last = t
	}
}

// Suspect implements Detector. Before any heartbeat it suspects nothing.
func (f *Fixed) Suspect(t time.Time) bool {
	return !f.last.IsZero() && t.Sub(f.last) >= f.Timeout
}

// PhiAccrual is the phi-accrual detector (Hayashibara et al., 2004): it
// learns the distribution of heartbeat intervals and suspects the primary
// once the silence so far is less likely than 10^-Threshold under a normal
// distribution fitted to the recent intervals. MinStdDev keeps a very
// regular sender from making it hair-trigger; MinSilence is a floor under
// which it never suspects.
//
// It is calibrated for a primary that is heard from more often than it
// promises: every replication record counts as a sign of life, but the
// primary only promises a heartbeat every HeartbeatEvery. An interval
// shorter than that is learned as HeartbeatEvery, so a stream of records
// (intervals far below a millisecond under guest load) does not teach the
// detector to expect a silence of a millisecond: its threshold is the same
// under load as on an idle link, and only intervals longer than promised
// (a jittery network, a primary's pauses) make it more patient.
type PhiAccrual struct {
	Threshold      float64
	MinStdDev      time.Duration
	MinSilence     time.Duration
	HeartbeatEvery time.Duration
	Window         int

	last      time.Time
	intervals []float64 // seconds
}

// Heartbeat implements Detector: the primary was heard from at t (a
// heartbeat or any other message).
func (p *PhiAccrual) Heartbeat(t time.Time) {
	if !p.last.IsZero() && t.After(p.last) {
		p.intervals = append(p.intervals, max(t.Sub(p.last), p.HeartbeatEvery).Seconds())
		if w := max(p.Window, 2); len(p.intervals) > w {
			p.intervals = p.intervals[len(p.intervals)-w:]
		}
	}
	if t.After(p.last) {
		p.last = t
	}
}

// Phi is the suspicion level at t.
func (p *PhiAccrual) Phi(t time.Time) float64 {
	if p.last.IsZero() || len(p.intervals) == 0 {
		return 0
	}
	var mean, sq float64
	for _, v := range p.intervals {
		mean += v
	}
	mean /= float64(len(p.intervals))
	for _, v := range p.intervals {
		sq += (v - mean) * (v - mean)
	}
	std := math.Max(math.Sqrt(sq/float64(len(p.intervals))), p.MinStdDev.Seconds())
	silence := t.Sub(p.last).Seconds()
	later := 0.5 * math.Erfc((silence-mean)/(std*math.Sqrt2)) // P(interval > silence)
	if later <= 0 {
		return math.Inf(1)
	}
	return -math.Log10(later)
}

// Suspect implements Detector.
func (p *PhiAccrual) Suspect(t time.Time) bool {
	if p.last.IsZero() || t.Sub(p.last) < p.MinSilence {
		return false
	}
	return p.Phi(t) >= p.Threshold
}

// Defaults for a LAN with heartbeats every 20 ms: the fixed detector
// suspects after 270 ms of silence; the phi detector suspects at phi 8 (a
// one-in-10^8 silence) with a 44 ms standard-deviation floor and a 230 ms
// minimum, which on a steady 20 ms heartbeat stream, with or without
// records between the heartbeats, comes to about 270 ms, and later on a
// link whose heartbeats come late. Why: a blackout of the link (or a
// scheduling hiccup) of 200 ms is followed by up to a heartbeat period
// before the next heartbeat arrives (the ones sent meanwhile were lost,
// and TCP's retransmissions come later still), so it is heard as up to
// 220 ms of silence plus jitter, and must not promote (with 50 ms
// heartbeats and a 250 ms threshold it did, one time in ten: the drill's
// blackout-200ms); and a guest's pause after a real failure is the
// detection plus a few milliseconds, which must stay under 300 ms.
const DefaultTimeout = 270 * time.Millisecond

// HeartbeatEvery is how often a primary sends a heartbeat, on its
// replication link and over UDP (package replicate's heartbeatEvery).
const HeartbeatEvery = 20 * time.Millisecond

// DetectorNames lists the names New accepts.
var DetectorNames = []string{"fixed", "phi"}

// New returns the named detector ("fixed" or "phi") with the defaults; an
// empty name means "fixed". Any other name is an error, never a silent
// fallback.
func New(kind string) (Detector, error) {
	switch kind {
	case "fixed", "":
		return &Fixed{Timeout: DefaultTimeout}, nil
	case "phi":
		return &PhiAccrual{Threshold: 8, MinStdDev: 44 * time.Millisecond, MinSilence: 230 * time.Millisecond,
			HeartbeatEvery: HeartbeatEvery, Window: 100}, nil
	}
	return nil, fmt.Errorf("unknown failure detector %q (want fixed or phi)", kind)
}
