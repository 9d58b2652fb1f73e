package drill

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

// TestFaultTable: every row can strike, has a name of its own and a help
// text, and its flags agree with what it checks.
func TestFaultTable(t *testing.T) {
	seen := map[string]bool{}
	for _, f := range faults {
		if f.name == "" || seen[f.name] || f.help == "" || f.inject == nil {
			t.Errorf("row %q: duplicate, or no help or inject", f.name)
		}
		seen[f.name] = true
		if f.unplanned && !f.takeover {
			t.Errorf("row %q: an unplanned takeover without a takeover", f.name)
		}
		if f.failovers < anyFailovers {
			t.Errorf("row %q: failovers %d", f.name, f.failovers)
		}
	}
	if lookup("kill") == nil || lookup("nope") != nil {
		t.Error("lookup")
	}
}

func TestDefaultFaults(t *testing.T) {
	for _, tc := range []struct {
		o    Options
		want []string
	}{
		{Options{Mode: "commit"}, []string{"kill", "freeze", "standby-kill", "switchover", "guest-cut",
			"failback", "standby-freeze", "standby-freeze-2s", "guest-start-after-failover"}},
		{Options{Mode: "commit", Netns: true}, []string{"kill", "freeze", "standby-kill", "switchover", "guest-cut", "partition",
			"failback", "standby-freeze", "standby-freeze-2s", "guest-start-after-failover"}},
		{Options{Mode: "epoch", Netns: true}, []string{"kill"}},
		{Options{Mode: "sync", Faults: []string{"freeze"}}, []string{"freeze"}},
	} {
		if got := tc.o.faults(); !slices.Equal(got, tc.want) {
			t.Errorf("%+v: %v, want %v", tc.o, got, tc.want)
		}
		if err := tc.o.Validate(); err != nil {
			t.Errorf("%+v: %v", tc.o, err)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{Mode: "commit", Faults: []string{"kill", "bogus"}}, `unknown fault "bogus" (valid: kill, freeze, standby-kill, switchover, guest-cut, partition, failback, standby-freeze, standby-freeze-2s, guest-start-after-failover)`},
		{Options{Mode: "commit", Faults: []string{""}}, `unknown fault ""`},
		{Options{Mode: "epoch", Faults: []string{"freeze"}}, `fault "freeze" is not drilled in epoch mode (valid there: kill)`},
		{Options{Mode: "commit", Faults: []string{"partition"}}, `fault "partition" needs network namespaces`},
		{Options{Mode: "bogus"}, `unknown replication mode "bogus"`},
	} {
		if err := tc.o.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.o, err, tc.want)
		}
		if _, err := Run(tc.o); err == nil {
			t.Errorf("%+v: Run did not refuse", tc.o)
		}
	}
}

// TestSummarize: only unplanned takeovers that happened go into the
// quantiles; lost and repeated requests both count.
func TestSummarize(t *testing.T) {
	rep := summarize("topo", "commit", []Record{
		{Fault: "kill", Passed: true, Failovers: 1, DetectionMS: 300, PauseMS: 400},
		{Fault: "freeze", Passed: true, Failovers: 1, DetectionMS: 200, PauseMS: 500},
		{Fault: "switchover", Passed: true, Failovers: 1, PauseMS: 5},
		{Fault: "kill", Failovers: 0, LostRequests: -2, Problem: "x"},
		{Fault: "guest-cut", Passed: true, Failovers: 1, PauseMS: 1, LostRequests: 3},
	})
	if rep.Iterations != 5 || rep.Passed != 4 || rep.Failed != 1 || rep.LostRequests != 5 {
		t.Errorf("totals: %+v", rep)
	}
	if rep.DetectionMS != (Quantiles{P50: 300, P99: 300, Max: 300}) || rep.PauseMS != (Quantiles{P50: 500, P99: 500, Max: 500}) {
		t.Errorf("quantiles: detection %+v pause %+v", rep.DetectionMS, rep.PauseMS)
	}
}

func TestWriteSVG(t *testing.T) {
	rep := summarize("topo", "commit", []Record{{Iteration: 1, Fault: "kill", Passed: true, Failovers: 1, PromotionMS: 310, PauseMS: 420}})
	var b bytes.Buffer
	if err := rep.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(b.String(), "<svg") || !strings.HasSuffix(b.String(), "</svg>\n") || strings.Count(b.String(), "<rect") != 4 {
		t.Errorf("svg:\n%s", b.String())
	}
}
