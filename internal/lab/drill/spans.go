package drill

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/vgpuha/vgpuha/internal/lab/drill/nodeproc"
	"github.com/vgpuha/vgpuha/pvdriver"
)

// Term is a word the demo's timeline, the drill's tables and its plot
// share: each span of a takeover is measured one way and named one way
// in all three, and each prints a legend (Legend) of the terms it shows.
type Term int

// The terms; the first six are spans of time, the rest how a guest
// fared.
const (
	TermSilence Term = iota
	TermDetection
	TermPromotion
	TermTakeover
	TermGuestPause
	TermBothServing
	TermGuestReconnect
	TermLost
)

// terms are each term's name and meaning (for a span: from → to).
var terms = [...]struct{ name, meaning string }{
	TermSilence:     {"silence", "the standby last heard the primary → its detector fired (what the node's status calls detection_seconds)"},
	TermDetection:   {"detection", "the fault → the standby decided to take over"},
	TermPromotion:   {"promotion", "the decision → the new primary served guests"},
	TermTakeover:    {"takeover", "the fault → the new primary served guests (detection + promotion)"},
	TermGuestPause:  {"guest pause", "the guest lost its node (its connection broke, or it made the first call left unanswered) → its session resumed on the new primary"},
	TermBothServing: {"both serving", "another node first answered a guest → the old primary last answered one (two nodes answered guests)"},
	TermGuestReconnect: {"guest reconnect", "how the guest found the new primary: its connection broke, or a call stalled on an open one; " +
		"tries: its rounds of asking the nodes (more than one: it was asking before the new primary served)"},
	TermLost: {"lost", "data lost: launches the guest was told were done that the GPU does not hold (negative: applied twice)"},
}

// String is the term's name.
func (t Term) String() string { return terms[t].name }

// Meaning says what the term measures.
func (t Term) Meaning() string { return terms[t].meaning }

// Legend writes one line per term: its name and what it means.
func Legend(w io.Writer, ts ...Term) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, t := range ts {
		fmt.Fprintf(tw, "  %s\t%s\n", t, t.Meaning())
	}
	return tw.Flush()
}

// Spans are one takeover's spans (zero where it had none).
type Spans struct {
	Silence, Detection, Promotion, Takeover time.Duration
	// GuestPause starts GuestLost after the fault (negative: before it,
	// a call the guest made just before the fault that went unanswered).
	GuestPause, GuestLost time.Duration
}

// MeasureSpans measures a takeover's spans from when the fault struck,
// the promoted node's record (nil: no node took over) and the guest's
// first failover (nil: it did not move). The nodes and the lab share one
// host and its clock.
func MeasureSpans(fault time.Time, p *nodeproc.Promotion, fo *pvdriver.Failover) Spans {
	var s Spans
	if p != nil {
		detected := p.Serving.Add(-seconds(p.PromotionSeconds))
		s.Silence, s.Promotion = seconds(p.DetectionSeconds), seconds(p.PromotionSeconds)
		s.Detection, s.Takeover = detected.Sub(fault), p.Serving.Sub(fault)
	}
	if fo != nil {
		s.GuestPause, s.GuestLost = fo.Resumed.Sub(fo.Lost), fo.Lost.Sub(fault)
	}
	return s
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// MS is d in milliseconds (what the drill's report holds).
func MS(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Reconnect says how the guest found the node it resumed on (the guest
// reconnect term).
func Reconnect(fo pvdriver.Failover) string { return reconnect(fo.Stalled, fo.Looks) }

// GuestReconnect is the guest reconnect term of the iteration's first
// failover, "-" if the guest did not move.
func (r Record) GuestReconnect() string {
	if r.Failovers == 0 {
		return "-"
	}
	return reconnect(r.GuestStalled, r.GuestLooks)
}

func reconnect(stalled bool, looks int) string {
	how, tries := "broken", "tries"
	if stalled {
		how = "stalled"
	}
	if looks == 1 {
		tries = "try"
	}
	return fmt.Sprintf("%s, %d %s", how, looks, tries)
}

// Header is t's column title in a table: its name in capitals, in ms if
// it is a span.
func (t Term) Header() string {
	if t <= TermBothServing {
		return strings.ToUpper(t.String()) + " ms"
	}
	return strings.ToUpper(t.String())
}
