package mmiotrace

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
)

// TestAutoMode: a page stored to in a streak is recorded store by store
// up to the streak, then opened and compared (its records first); in the
// next interval the page is hot and opens at its first fault; a page
// stored to a few times per interval (doorbell-like) stays per write,
// its stores recorded in order. The replica equals the guest's memory
// throughout (replica.run checks).
func TestAutoMode(t *testing.T) {
	skipUnlessTraceable(t, ModeAuto)
	g := startGuest(t, goGuest())
	defer g.stop()
	tr, rp := trace(t, g, ModeAuto, KindMemory)
	defer tr.Close()
	var want []string
	for i := 0; i < 64; i++ { // "seq": 64 stores to page 0
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], uint64(i)*0x0101010101010101+1)
		want = append(want, fmt.Sprintf("%d:%x", 8*i, b))
	}
	writes := rp.run(t, g, tr, "seq")
	st := tr.Stats()
	if st.Streaks != 1 || st.Faults != autoStreak+1 || len(writes) < autoStreak+1 ||
		strings.Join(writes[:autoStreak], " ") != strings.Join(want[:autoStreak], " ") {
		t.Fatalf("a streak: %+v, writes %v; want %d records of the first stores, then the page's changes", st, writes, autoStreak)
	}
	// Hot: the page opens at its first fault now (and changes nothing:
	// the same values again).
	rp.run(t, g, tr, "seq")
	if st2 := tr.Stats(); st2.Faults != st.Faults+1 || st2.Streaks != st.Streaks {
		t.Fatalf("a hot page: %+v after %+v; want one more fault, no new streak", st2, st)
	}
	// It changed nothing, so it is per write again: two runs of three
	// stores on page 2 (atomics) are recorded store by store.
	rp.run(t, g, tr, "seq")
	st = tr.Stats()
	for round := 0; round < 2; round++ {
		writes := rp.run(t, g, tr, "atomics")
		if len(writes) != 3 || !strings.HasPrefix(writes[0], fmt.Sprint(2*pageSize)) {
			t.Fatalf("round %d: doorbell-like page: writes %v, want its 3 stores", round, writes)
		}
	}
	if st2 := tr.Stats(); st2.Streaks != st.Streaks || st2.Faults != st.Faults+6 {
		t.Fatalf("doorbell-like page: %+v after %+v; want 6 faults, no streak", st2, st)
	}
	// A stream over pages 4-7 (a 3-page memmove): its first page streaks,
	// the pages after it open at their first fault; run again, the hot
	// ones open together at the first fault.
	st = tr.Stats()
	rp.run(t, g, tr, "copy")
	first := tr.Stats()
	rp.run(t, g, tr, "copy")
	again := tr.Stats()
	t.Logf("copy: %d faults, %d streaks; again: %d faults", first.Faults-st.Faults, first.Streaks-st.Streaks, again.Faults-first.Faults)
	if first.Streaks-st.Streaks != 1 || first.Faults-st.Faults > autoStreak+4 || again.Faults-first.Faults > 2 || again.Streaks != first.Streaks {
		t.Fatalf("a stream over 4 pages: %+v, then %+v after %+v; want 1 streak and a fault per page after it, then the hot pages opened at one fault", first, again, st)
	}
}
