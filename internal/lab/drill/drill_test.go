package drill

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/internal/lab/mmioguest"
	"github.com/vgpuha/vgpuha/pvdriver"
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
		{Options{Mode: "commit", Coordinator: true, CoordinatorTTL: time.Second}, []string{"kill", "freeze", "standby-kill", "switchover", "guest-cut", "partition",
			"standby-freeze", "standby-freeze-2s", "guest-start-after-failover", "standby-loss", "etcd-member-kill"}},
		{Options{Mode: "sync", Coordinator: true, CoordinatorTTL: time.Second, SideBySide: true, Faults: []string{"partition", "etcd-member-kill"}}, []string{"partition", "etcd-member-kill"}},
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
		{Options{Mode: "commit", Faults: []string{"kill", "bogus"}}, `unknown fault "bogus" (valid: kill, freeze, standby-kill, switchover, guest-cut, partition, failback, standby-freeze, standby-freeze-2s, guest-start-after-failover, standby-loss, etcd-member-kill, blackout-100ms, blackout-200ms, blackout-600ms, freeze-100ms, freeze-200ms, freeze-600ms, etcd-freeze)`},
		{Options{Mode: "commit", Faults: []string{""}}, `unknown fault ""`},
		{Options{Mode: "epoch", Faults: []string{"freeze"}}, `fault "freeze" is not drilled in epoch mode (valid there: kill)`},
		{Options{Mode: "commit", Faults: []string{"partition"}}, `fault "partition" needs network namespaces`},
		{Options{Mode: "bogus"}, `unknown replication mode "bogus"`},
		{Options{Mode: "commit", Faults: []string{"standby-loss"}}, `fault "standby-loss" needs --coordinator`},
		{Options{Mode: "commit", Coordinator: true, CoordinatorTTL: time.Second, Faults: []string{"failback"}}, `fault "failback" is not drilled with --coordinator (valid there: kill, freeze, standby-kill, switchover, guest-cut, partition, standby-freeze, standby-freeze-2s, guest-start-after-failover, standby-loss, etcd-member-kill, blackout-100ms, blackout-200ms, freeze-100ms, freeze-200ms, etcd-freeze)`},
		{Options{Mode: "epoch", Coordinator: true, CoordinatorTTL: time.Second}, `--coordinator is not drilled in epoch mode`},
		{Options{Mode: "commit", SideBySide: true}, `--side-by-side compares with --coordinator`},
		{Options{Mode: "commit", Coordinator: true, CoordinatorTTL: 1500 * time.Millisecond}, `--coordinator.ttl 1.5s: want whole seconds`},
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
	rep := summarize(Options{Mode: "commit"}, []Record{
		{Fault: "kill", Passed: true, Failovers: 1, DetectionMS: 300, TakeoverMS: 320, PauseMS: 400},
		{Fault: "freeze", Passed: true, Failovers: 1, DetectionMS: 200, TakeoverMS: 230, PauseMS: 500},
		{Fault: "switchover", Passed: true, Failovers: 1, PauseMS: 5},
		{Fault: "kill", Failovers: 0, LostRequests: -2, Problem: "x"},
		{Fault: "guest-cut", Passed: true, Failovers: 1, PauseMS: 1, LostRequests: 3},
	})
	if rep.Iterations != 5 || rep.Passed != 4 || rep.Failed != 1 || rep.LostRequests != 5 {
		t.Errorf("totals: %+v", rep)
	}
	if rep.DetectionMS != (Quantiles{P50: 300, P99: 300, Max: 300}) || rep.TakeoverMS != (Quantiles{P50: 320, P99: 320, Max: 320}) ||
		rep.PauseMS != (Quantiles{P50: 500, P99: 500, Max: 500}) {
		t.Errorf("quantiles: detection %+v takeover %+v pause %+v", rep.DetectionMS, rep.TakeoverMS, rep.PauseMS)
	}
}

// TestSummarizeFaults: one row per fault and setup, in the order first
// drilled; detection counts takeovers, pause counts failovers, and every
// iteration's double-serving time counts.
func TestSummarizeFaults(t *testing.T) {
	got := summarizeFaults([]Record{
		{Fault: "partition", Coordinated: true, Passed: true, Failovers: 1, DetectionMS: 1100, TakeoverMS: 1150, PauseMS: 700},
		{Fault: "partition", Passed: true, Failovers: 1, DetectionMS: 250, TakeoverMS: 270, PauseMS: 400, BothServingMS: 260, LostRequests: -1},
		{Fault: "partition", Coordinated: true, Failovers: 1, DetectionMS: 1300, TakeoverMS: 1350, PauseMS: 900, BothServingMS: 5},
		{Fault: "etcd-member-kill", Coordinated: true, Passed: true},
	})
	want := []FaultSummary{
		{Fault: "partition", Coordinated: true, Iterations: 2, Passed: 1, DetectionMS: Quantiles{1300, 1300, 1300},
			TakeoverMS: Quantiles{1350, 1350, 1350}, PauseMS: Quantiles{900, 900, 900}, BothServingMS: Quantiles{5, 5, 5}},
		{Fault: "partition", Iterations: 1, Passed: 1, LostRequests: 1, DetectionMS: Quantiles{250, 250, 250},
			TakeoverMS: Quantiles{270, 270, 270}, PauseMS: Quantiles{400, 400, 400}, BothServingMS: Quantiles{260, 260, 260}},
		{Fault: "etcd-member-kill", Coordinated: true, Iterations: 1, Passed: 1},
	}
	if !slices.Equal(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
}

// TestDemoPassed: a demo passes with a loss only in a mode that may lose
// work, and only if the guests still finished verified on the standby.
func TestDemoPassed(t *testing.T) {
	for _, tc := range []struct {
		mode      string
		loss, bad bool
		want      bool
	}{
		{"commit", false, false, true},
		{"commit", true, false, false},
		{"sync", true, false, false},
		{"epoch", true, false, true},
		{"async", true, false, true},
		{"async", false, false, true},
		{"epoch", true, true, false},
	} {
		res := &DemoResult{Mode: tc.mode, Round2Verified: !tc.bad, Failovers: make([]pvdriver.Failover, 1),
			Aperture: mmioguest.Result{Verified: true, Failovers: 1}}
		if tc.loss {
			res.Loss = &Loss{Promise: PromiseOf(tc.mode)}
		}
		if got := res.Passed(); got != tc.want {
			t.Errorf("%s mode, loss %v, round 2 failed %v: passed %v, want %v", tc.mode, tc.loss, tc.bad, got, tc.want)
		}
	}
}
