package failover

import (
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

// beat feeds heartbeats every interval from 0 to until (ms).
func beat(d Detector, interval, until int) {
	for ms := 0; ms <= until; ms += interval {
		d.Heartbeat(at(ms))
	}
}

func TestFixed(t *testing.T) {
	d := mustNew("fixed")
	if d.Suspect(at(10000)) {
		t.Fatal("suspects before any heartbeat")
	}
	beat(d, 50, 1000)
	for _, tc := range []struct {
		ms   int
		want bool
	}{{1100, false}, {1269, false}, {1270, true}, {5000, true}} {
		if got := d.Suspect(at(tc.ms)); got != tc.want {
			t.Errorf("at %d ms: suspect %v, want %v", tc.ms, got, tc.want)
		}
	}
	d.Heartbeat(at(1350)) // the primary was only slow
	if d.Suspect(at(1450)) {
		t.Error("still suspects after a fresh heartbeat")
	}
}

func TestPhiAccrual(t *testing.T) {
	d := mustNew("phi").(*PhiAccrual)
	beat(d, int(HeartbeatEvery/time.Millisecond), 5000)
	first := -1
	for ms := 5000; ms < 6000; ms += 5 {
		if d.Suspect(at(ms)) {
			first = ms - 5000
			break
		}
	}
	if first < 240 || first > 290 {
		t.Fatalf("steady heartbeats every %v: suspected after %d ms of silence, want 240..290", HeartbeatEvery, first)
	}
	// A jittery sender widens the distribution: the same silence after
	// its last heartbeat is less suspicious.
	j := mustNew("phi").(*PhiAccrual)
	last := 0
	for i, ms := 0, 0; ms <= 5000; i++ {
		j.Heartbeat(at(ms))
		last = ms
		ms += 20 + (i%5)*30 // 20..140 ms
	}
	if j.Phi(at(last+first)) >= d.Phi(at(5000+first)) {
		t.Error("jittery heartbeats not treated more leniently than steady ones")
	}
}

// TestNoFalseSuspicionUnderHiccups: with heartbeats every 50 ms and
// occasional 120 ms gaps (GC, a lost packet), neither detector fires.
func TestNoFalseSuspicionUnderHiccups(t *testing.T) {
	for _, kind := range []string{"fixed", "phi"} {
		d := mustNew(kind)
		ms := 0
		for i := 0; i < 72000; i++ { // an hour of heartbeats
			gap := 50
			if i%97 == 0 {
				gap = 120
			}
			for probe := ms; probe < ms+gap; probe += 10 {
				if d.Suspect(at(probe)) {
					t.Fatalf("%s: false suspicion at %d ms", kind, probe)
				}
			}
			ms += gap
			d.Heartbeat(at(ms))
		}
	}
}

func mustNew(kind string) Detector {
	d, err := New(kind)
	if err != nil {
		panic(err)
	}
	return d
}

func TestNewRefusesUnknownDetector(t *testing.T) {
	if _, err := New("bogus"); err == nil {
		t.Fatal("New(bogus) returned a detector; want an error")
	}
}

// TestDetectorsUnderRecordTraffic drives a standby's Node as the node
// does under guest load: a heartbeat every HeartbeatEvery, a replication record
// every half millisecond between them, each heard, and a tick every 5 ms.
// A 200 ms blackout of everything, followed by a heartbeat period in
// which the first heartbeat after it is still on its way (the worst
// phase), promotes with neither detector; a 600 ms one does, about
// 270 ms into it, as the docs say.
func TestDetectorsUnderRecordTraffic(t *testing.T) {
	for _, kind := range []string{"fixed", "phi"} {
		n := NewStandby(mustNew(kind))
		n.Step(Event{Kind: Synced, InSync: true})
		step := 500 * time.Microsecond
		now := t0
		// traffic runs for d; it returns the first promotion, if any.
		traffic := func(d time.Duration, heard bool) (time.Duration, bool) {
			start := now
			for end := now.Add(d); now.Before(end); now = now.Add(step) {
				since := now.Sub(start)
				if heard {
					n.Step(Event{Kind: Heard, At: now, Term: 1})
				}
				if since%(5*time.Millisecond) == 0 {
					for _, a := range n.Step(Event{Kind: Tick, At: now}) {
						if a.Kind == Promote {
							return since, true
						}
					}
				}
			}
			return 0, false
		}
		if at, promoted := traffic(2*time.Second, true); promoted {
			t.Fatalf("%s: promoted %v into steady traffic", kind, at)
		}
		if at, promoted := traffic(200*time.Millisecond+HeartbeatEvery, false); promoted {
			t.Fatalf("%s: a 200 ms blackout under load (and a heartbeat period) promoted %v into it", kind, at)
		}
		if at, promoted := traffic(2*time.Second, true); promoted {
			t.Fatalf("%s: promoted %v after the blackout", kind, at)
		}
		at, promoted := traffic(600*time.Millisecond, false)
		if !promoted || at < 240*time.Millisecond || at > 300*time.Millisecond {
			t.Fatalf("%s: a 600 ms blackout under load: promoted %v, %v into it; want about 270 ms", kind, promoted, at)
		}
	}
}
