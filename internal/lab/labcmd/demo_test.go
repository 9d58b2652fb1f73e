package labcmd

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/internal/lab/drill"
	"github.com/vgpuha/vgpuha/internal/lab/drill/nodeproc"
	"github.com/vgpuha/vgpuha/pvdriver"
)

// demoResult is a hand-made demo in mode: a kill, a takeover after
// 300 ms, the guest back after 305 ms; with loss, rolled back to request
// 57 after round 2's first workload.
func demoResult(mode string, loss bool) *drill.DemoResult {
	killed := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return killed.Add(time.Duration(n) * time.Millisecond) }
	res := &drill.DemoResult{Mode: mode, Backend: "sim", KilledAfter: "histogram", Killed: killed, StandbyRole: "primary", Round2Verified: true,
		Promotion: &nodeproc.Promotion{Term: 2, DetectionSeconds: 0.29, PromotionSeconds: 0.02, Serving: ms(300), DiscardedEpochRecords: 7},
		Failovers: []pvdriver.Failover{{Lost: ms(2), Resumed: ms(307), Endpoint: "unix:///tmp/s.sock", Looks: 40, Resent: 1}}}
	if mode == "epoch" {
		res.Checkpoint = &drill.Checkpoint{Epoch: 1, At: ms(-40)}
	}
	if loss {
		res.Loss = &drill.Loss{Promise: drill.PromiseOf(mode), RolledBackTo: 57, Finished: []string{"histogram"}, Interrupted: "matmul", Rerun: true,
			GuestView: "pvdriver: resumed session was rolled back: unix:///tmp/s.sock holds the session only up to request 57, but request 66 had completed"}
	}
	return res
}

// TestPrintDemoTimeline: the timeline runs in time order from the fault,
// names each span as the drill does, and the legend under it says what
// each measures.
func TestPrintDemoTimeline(t *testing.T) {
	var b bytes.Buffer
	printDemo(&b, demoResult("commit", false))
	out := b.String()
	var order []string
	for _, want := range []string{"t=0", "+2ms", "+280ms", "+300ms", "+307ms"} {
		i := strings.Index(out, "\n  "+want+" ")
		if i < 0 {
			t.Fatalf("timeline lacks %s:\n%s", want, out)
		}
		order = append(order, out[i:])
	}
	for i := 1; i < len(order); i++ {
		if len(order[i]) > len(order[i-1]) {
			t.Errorf("timeline out of order at %q:\n%s", order[i][:10], out)
		}
	}
	for _, want := range []string{"detection 280.0 ms", "silence 290.0 ms", "promotion 20.0 ms", "takeover 300.0 ms", "guest pause 305.0 ms",
		"guest reconnect: broken, 40 tries", "promoted to term 2"} {
		if !strings.Contains(out, want) {
			t.Errorf("timeline lacks %q:\n%s", want, out)
		}
	}
	for _, tm := range []drill.Term{drill.TermSilence, drill.TermDetection, drill.TermPromotion, drill.TermTakeover, drill.TermGuestPause, drill.TermGuestReconnect} {
		if !strings.Contains(out, tm.Meaning()) {
			t.Errorf("legend lacks %s:\n%s", tm, out)
		}
	}
	if strings.Contains(out, "loss") {
		t.Errorf("commit mode without a loss speaks of loss:\n%s", out)
	}
}

// TestPrintDemoLoss: in a mode that may lose work the demo says what was
// lost, what the mode promises, what the guest was told and where it went
// back to; in one that may not, the loss is not allowed.
func TestPrintDemoLoss(t *testing.T) {
	for _, tc := range []struct {
		mode string
		loss bool
		want []string
	}{
		{"epoch", true, []string{"loss, as epoch mode allows: " + drill.PromiseOf("epoch").What, "lost: the guest's requests after request 57, the tail of round 2's work so far: histogram (finished before the fault), matmul (under way when the guest was told)",
			"discarded the uncommitted epoch after epoch 1: 7 records, the guest's last 40ms", "the guest was told: pvdriver: resumed session was rolled back",
			"went back to request 57", "ran round 2 again"}},
		{"async", true, []string{"loss, as async mode allows: " + drill.PromiseOf("async").What, "went back to request 57"}},
		{"async", false, []string{"loss: none. async mode may lose work"}},
		{"commit", true, []string{"LOSS NOT ALLOWED: commit mode promises that " + drill.PromiseOf("commit").What}},
	} {
		var b bytes.Buffer
		printDemo(&b, demoResult(tc.mode, tc.loss))
		for _, want := range tc.want {
			if !strings.Contains(b.String(), want) {
				t.Errorf("%s, loss %v: output lacks %q:\n%s", tc.mode, tc.loss, want, b.String())
			}
		}
	}
}
