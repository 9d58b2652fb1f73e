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
	}{{1100, false}, {1249, false}, {1250, true}, {5000, true}} {
		if got := d.Suspect(at(tc.ms)); got != tc.want {
			t.Errorf("at %d ms: suspect %v, want %v", tc.ms, got, tc.want)
		}
	}
	d.Heartbeat(at(1300)) // the primary was only slow
	if d.Suspect(at(1400)) {
		t.Error("still suspects after a fresh heartbeat")
	}
}

func TestPhiAccrual(t *testing.T) {
	d := mustNew("phi").(*PhiAccrual)
	beat(d, 50, 5000)
	first := -1
	for ms := 5000; ms < 6000; ms += 5 {
		if d.Suspect(at(ms)) {
			first = ms - 5000
			break
		}
	}
	if first < 150 || first > 300 {
		t.Fatalf("steady 50 ms heartbeats: suspected after %d ms of silence, want 150..300", first)
	}
	// A jittery sender widens the distribution: the same silence is less
	// suspicious.
	j := mustNew("phi").(*PhiAccrual)
	for i, ms := 0, 0; ms <= 5000; i++ {
		j.Heartbeat(at(ms))
		ms += 20 + (i%5)*30 // 20..140 ms
	}
	if j.Phi(at(5000+first)) >= d.Phi(at(5000+first)) {
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
