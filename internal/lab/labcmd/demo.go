package labcmd

import (
	"cmp"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/vgpuha/vgpuha/internal/agent"
	"github.com/vgpuha/vgpuha/internal/cli"
	"github.com/vgpuha/vgpuha/internal/lab/drill"
)

// runDemo shows the product's point on one machine: it starts a standby and
// a primary as separate processes (the embedded default: the software GPU
// unless a GPU is present, everything on loopback), runs every workload
// through a guest, SIGKILLs the primary in the middle of the second round,
// and the guest finishes on the promoted standby with verified results. In
// async and epoch mode it says what the takeover lost and whether the mode
// allows that loss; it fails only on a loss the mode does not allow.
func runDemo(args []string) error {
	fs := cli.NewFlags("demo", "[flags]")
	backendName := cli.String(fs, "backend", "auto", agent.CheckBackend, "GPU backend for both nodes: auto, cuda or sim")
	mode := cli.Choice(fs, "mode", "commit", agent.ReplicationModes, "replication mode: sync, commit, async or epoch (async and epoch may lose work at a takeover: the demo says what)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	bin, err := os.Executable()
	if err != nil {
		return err
	}
	res, err := drill.Demo(drill.DemoOptions{Binary: bin, Backend: *backendName, Mode: *mode})
	if res != nil {
		printDemo(os.Stdout, res)
	}
	return err
}

func printDemo(w io.Writer, res *drill.DemoResult) {
	fmt.Fprintf(w, "primary (pid %d) and standby (pid %d) up: %s backend, %s mode, protected\n", res.PrimaryPID, res.StandbyPID, res.Backend, res.Mode)
	fmt.Fprintf(w, "round 1 on the primary: %d workloads, all verified: %v\n", len(res.Round1), res.Round1Verified)
	if cp := res.Checkpoint; cp != nil {
		fmt.Fprintf(w, "epoch %d cut on the primary and committed on the standby (the VM's checkpoint)\n", cp.Epoch)
	}
	fmt.Fprintf(w, "SIGKILL primary after %s in round 2\n", res.KilledAfter)
	fmt.Fprintln(w)
	printResults(w, res.Round2)
	printTimeline(w, res)
	printLoss(w, res)
	fmt.Fprintf(w, "\nround 2 finished on the promoted standby (%s); results verified and identical to round 1: %v\n", res.StandbyRole, res.Round2Verified)
	fmt.Fprintf(w, "aperture guest (pid %d, writes traced in %s mode): %d stores to mapped device memory, half of them after the primary died;\n"+
		"  resumed on the standby (%d failover), whose device copy equals everything it wrote: %v\n",
		res.AperturePID, res.Aperture.Mode, res.Aperture.Writes, res.Aperture.Failovers, res.Aperture.Verified)
}

// printTimeline prints the takeover as the demo saw it, from the fault,
// in the spans the drill reports too, and their legend.
func printTimeline(w io.Writer, res *drill.DemoResult) {
	type event struct {
		at   time.Duration // after the fault
		what string
	}
	events := []event{{0, "fault: the primary is SIGKILLed"}}
	if p := res.Promotion; p != nil {
		s := drill.MeasureSpans(res.Killed, p, nil)
		events = append(events,
			event{s.Detection, fmt.Sprintf("the standby decides to take over: %s %.1f ms (%s %.1f ms)", drill.TermDetection, drill.MS(s.Detection),
				drill.TermSilence, drill.MS(s.Silence))},
			event{s.Takeover, fmt.Sprintf("the standby, promoted to term %d, serves guests: %s %.1f ms, %s %.1f ms", p.Term,
				drill.TermPromotion, drill.MS(s.Promotion), drill.TermTakeover, drill.MS(s.Takeover))})
	}
	for _, f := range res.Failovers {
		s := drill.MeasureSpans(res.Killed, nil, &f)
		how := "its connection broke"
		if f.Stalled {
			how = "a call went unanswered"
		}
		events = append(events, event{s.GuestLost, "the guest loses its node: " + how},
			event{s.GuestLost + s.GuestPause, fmt.Sprintf("the guest resumes its session on %s (%s: %s; resent %d requests): %s %.1f ms",
				strings.TrimPrefix(f.Endpoint, "unix://"), drill.TermGuestReconnect, drill.Reconnect(f), f.Resent, drill.TermGuestPause, drill.MS(s.GuestPause))})
	}
	slices.SortStableFunc(events, func(a, b event) int { return cmp.Compare(a.at, b.at) })
	fmt.Fprintln(w, "\ntimeline (from the fault):")
	for _, e := range events {
		at := "t=0"
		if e.at != 0 {
			at = fmt.Sprintf("%+dms", e.at.Round(time.Millisecond).Milliseconds())
		}
		fmt.Fprintf(w, "  %-7s  %s\n", at, e.what)
	}
	fmt.Fprintln(w, "spans (the drill's too):")
	drill.Legend(w, drill.TermSilence, drill.TermDetection, drill.TermPromotion, drill.TermTakeover, drill.TermGuestPause, drill.TermGuestReconnect)
}

// printLoss says, in a mode that may lose work, what the takeover lost,
// what the mode promises, what the guest was told and where it went back
// to; in a mode that may not, the loss.
func printLoss(w io.Writer, res *drill.DemoResult) {
	l, pr := res.Loss, drill.PromiseOf(res.Mode)
	switch {
	case l == nil && !pr.MayLose:
		return
	case l == nil:
		fmt.Fprintf(w, "\nloss: none. %s mode may lose work: %s; this takeover lost none (the standby had applied everything the guest was told was done)\n", res.Mode, pr.What)
		return
	case !pr.MayLose:
		fmt.Fprintf(w, "\nLOSS NOT ALLOWED: %s mode promises that %s, yet the guest was told: %s\n", res.Mode, pr.What, l.GuestView)
		return
	}
	fmt.Fprintf(w, "\nloss, as %s mode allows: %s.\n", res.Mode, pr.What)
	var what []string
	if len(l.Finished) > 0 {
		what = append(what, strings.Join(l.Finished, ", ")+" (finished before the fault)")
	}
	if l.Interrupted != "" {
		what = append(what, l.Interrupted+" (under way when the guest was told)")
	}
	fmt.Fprintf(w, "  lost: the guest's requests after request %d, the tail of round 2's work so far: %s\n", l.RolledBackTo, strings.Join(what, ", "))
	if p := res.Promotion; res.Checkpoint != nil && p != nil {
		fmt.Fprintf(w, "  the standby discarded the uncommitted epoch after epoch %d: %d records, the guest's last %v before the fault\n",
			res.Checkpoint.Epoch, p.DiscardedEpochRecords, res.Killed.Sub(res.Checkpoint.At).Round(time.Millisecond))
	}
	fmt.Fprintf(w, "  the guest was told: %s\n", l.GuestView)
	fmt.Fprintf(w, "  the guest went back to request %d, where the new primary's copy of its session ends, and ran round 2 again from its start\n", l.RolledBackTo)
}
