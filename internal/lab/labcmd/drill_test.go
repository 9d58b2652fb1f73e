package labcmd

import (
	"bytes"
	"strings"
	"testing"

	"github.com/vgpuha/vgpuha/internal/lab/drill"
)

// TestPrintDrill: both tables title their columns with the shared terms,
// the legend under them says what each means, the guest's reconnect says
// how it found the new primary (never "lost": that is data), and a
// both-serving window says when it began.
func TestPrintDrill(t *testing.T) {
	rep := drill.Report{Topology: "loopback", Mode: "commit", Iterations: 2, Passed: 2, Records: []drill.Record{
		{Iteration: 1, Fault: "kill", Passed: true, Failovers: 1, SilenceMS: 281, DetectionMS: 275, PromotionMS: 20, TakeoverMS: 295,
			PauseMS: 290, PauseFromMS: 3, GuestLooks: 4},
		{Iteration: 2, Fault: "partition", Passed: true, Failovers: 1, DetectionMS: 270, PromotionMS: 25, TakeoverMS: 295, PauseMS: 120,
			GuestLooks: 51, GuestStalled: true, BothServingMS: 62.6, BothServingFromMS: 297.5},
	}, Faults: []drill.FaultSummary{{Fault: "kill", Iterations: 1, Passed: 1}}}
	var b bytes.Buffer
	printDrill(&b, rep)
	out := b.String()
	lines := strings.Split(out, "\n")
	perIteration, perFault := lines[0], ""
	for _, l := range lines {
		if strings.HasPrefix(l, "FAULT ") {
			perFault = l
		}
	}
	for _, tm := range []drill.Term{drill.TermSilence, drill.TermDetection, drill.TermPromotion, drill.TermTakeover, drill.TermGuestPause,
		drill.TermGuestReconnect, drill.TermLost, drill.TermBothServing} {
		if !strings.Contains(perIteration, tm.Header()) {
			t.Errorf("per-iteration header lacks %q: %s", tm.Header(), perIteration)
		}
		if !strings.Contains(out, tm.Meaning()) {
			t.Errorf("legend lacks %s: %q", tm, tm.Meaning())
		}
	}
	for _, tm := range []drill.Term{drill.TermDetection, drill.TermTakeover, drill.TermGuestPause, drill.TermLost, drill.TermBothServing} {
		if !strings.Contains(perFault, tm.Header()) {
			t.Errorf("per-fault header lacks %q: %s", tm.Header(), perFault)
		}
	}
	for _, want := range []string{"broken, 4 tries", "stalled, 51 tries", "62.6 (from +297.5)"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "FOUND IT") || strings.Contains(out, "looks") {
		t.Errorf("the old wording is back:\n%s", out)
	}
}
