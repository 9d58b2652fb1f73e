package drill

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/internal/lab/drill/nodeproc"
	"github.com/vgpuha/vgpuha/pvdriver"
)

// TestMeasureSpans: each span runs between the instants its term names,
// the ones after the fault measured from it.
func TestMeasureSpans(t *testing.T) {
	fault := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	p := &nodeproc.Promotion{Term: 2, DetectionSeconds: 0.29, PromotionSeconds: 0.02, Serving: fault.Add(ms(300))}
	fo := &pvdriver.Failover{Lost: fault.Add(ms(5)), Resumed: fault.Add(ms(310)), Looks: 3}
	got := MeasureSpans(fault, p, fo)
	want := Spans{Silence: ms(290), Detection: ms(280), Promotion: ms(20), Takeover: ms(300), GuestPause: ms(305), GuestLost: ms(5)}
	if got != want {
		t.Errorf("spans %+v, want %+v", got, want)
	}
	if got := MeasureSpans(fault, nil, nil); got != (Spans{}) {
		t.Errorf("no takeover, no failover: %+v", got)
	}

	var rec Record
	rec.noteTakeover(p, fault)
	rec.noteFailovers([]pvdriver.Failover{*fo}, fault)
	if rec.SilenceMS != 290 || rec.DetectionMS != 280 || rec.PromotionMS != 20 || rec.TakeoverMS != 300 ||
		rec.PauseMS != 305 || rec.PauseFromMS != 5 || rec.Failovers != 1 || rec.GuestLooks != 3 {
		t.Errorf("record %+v", rec)
	}
	rec = Record{}
	rec.noteFailovers([]pvdriver.Failover{*fo}, time.Time{})
	if rec.PauseMS != 305 || rec.PauseFromMS != 0 {
		t.Errorf("no fault struck: pause %v from %v, want 305 from 0", rec.PauseMS, rec.PauseFromMS)
	}
}

// TestTerms: every term has a name of its own and a meaning; a span's
// column is in ms; the legend prints each term asked for, once, with its
// meaning; guest reconnect says how and in how many tries, never "lost".
func TestTerms(t *testing.T) {
	seen := map[string]bool{}
	for tm := TermSilence; tm <= TermLost; tm++ {
		if tm.String() == "" || tm.Meaning() == "" || seen[tm.String()] {
			t.Errorf("term %d: name %q, meaning %q", tm, tm, tm.Meaning())
		}
		seen[tm.String()] = true
		if span := tm <= TermBothServing; span != strings.HasSuffix(tm.Header(), " ms") {
			t.Errorf("%s: header %q", tm, tm.Header())
		}
	}
	if len(seen) != len(terms) {
		t.Errorf("%d terms named, table has %d", len(seen), len(terms))
	}
	var b bytes.Buffer
	if err := Legend(&b, TermDetection, TermTakeover, TermGuestPause); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	for i, tm := range []Term{TermDetection, TermTakeover, TermGuestPause} {
		if i >= len(lines) || !strings.HasPrefix(strings.TrimSpace(lines[i]), tm.String()+" ") || !strings.HasSuffix(lines[i], tm.Meaning()) {
			t.Errorf("legend line %d for %s:\n%s", i, tm, b.String())
		}
	}
	if len(lines) != 3 {
		t.Errorf("legend has %d lines, want 3:\n%s", len(lines), b.String())
	}
	for _, tc := range []struct {
		r    Record
		want string
	}{
		{Record{}, "-"},
		{Record{Failovers: 1, GuestLooks: 1}, "broken, 1 try"},
		{Record{Failovers: 2, GuestLooks: 51, GuestStalled: true}, "stalled, 51 tries"},
	} {
		if got := tc.r.GuestReconnect(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.r, got, tc.want)
		}
	}
}
