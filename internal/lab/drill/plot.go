package drill

import (
	"bufio"
	"fmt"
	"html"
	"io"
)

// The plot's geometry (px): the iterations' labels, then the time axis;
// legend text is sized at charWidth per character (a generous average
// for 11 px sans-serif), and the canvas is made wide enough for it.
const (
	plotLeft, plotWidth, plotRow, plotTop = 170, 640, 18, 40
	plotMargin, legendLine, charWidth     = 10, 16, 6.6
	titleCharWidth                        = 8.0 // 13 px
	ink                                   = "#111"
)

// plotBar is a bar the plot draws, with its legend entry.
type plotBar struct {
	term  Term
	color string
	// span is the bar in a record, in ms from the fault (ok false: none).
	span func(r Record) (from, to float64, ok bool)
}

var plotBars = []plotBar{
	{TermDetection, "#e69f00", func(r Record) (float64, float64, bool) { return 0, r.DetectionMS, r.TakeoverMS > 0 }},
	{TermPromotion, "#d33", func(r Record) (float64, float64, bool) {
		return r.TakeoverMS - r.PromotionMS, r.TakeoverMS, r.TakeoverMS > 0
	}},
	{TermGuestPause, "#36c", func(r Record) (float64, float64, bool) {
		return r.PauseFromMS, r.PauseFromMS + r.PauseMS, r.Failovers > 0 && r.PauseMS > 0
	}},
	{TermBothServing, "#a3c", func(r Record) (float64, float64, bool) {
		return r.BothServingFromMS, r.BothServingFromMS + r.BothServingMS, r.BothServingMS > 0
	}},
}

// WriteSVG draws the drill as a timeline: one row per iteration, time
// from the moment the fault struck, on a white background with dark text
// (it reads on light and dark viewers). Each row's upper bar is the
// takeover (detection, then promotion), its lower bar the guest pause,
// and a shaded band across the row the window in which both nodes
// answered guests; the legend below says what each measures.
func (rep Report) WriteSVG(out io.Writer) error {
	f := bufio.NewWriter(out)
	w := func(format string, a ...any) { fmt.Fprintf(f, format, a...) }
	text := func(x, y float64, attrs, s string) {
		w(`<text x="%.1f" y="%.1f" fill="%s"%s>%s</text>`+"\n", x, y, ink, attrs, html.EscapeString(s))
	}
	title := fmt.Sprintf("vgpuha drill, mode %s: %d/%d passed, %d requests lost; %s p50 %.0f ms, %s p50 %.0f ms, %s p50 %.0f ms",
		rep.Mode, rep.Passed, rep.Iterations, rep.LostRequests, TermDetection, rep.DetectionMS.P50, TermTakeover, rep.TakeoverMS.P50, TermGuestPause, rep.PauseMS.P50)
	legend := rep.legend()
	maxMS := rep.plotSpan()
	axisY := float64(plotTop + plotRow*len(rep.Records) + 5)
	width, height := rep.canvas(title, legend, axisY)
	x := func(ms float64) float64 { return plotLeft + max(0, ms)/maxMS*plotWidth }
	w(`<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="11">`+"\n", width, height)
	w(`<rect x="0" y="0" width="%.0f" height="%.0f" fill="#fff"/>`+"\n", width, height)
	text(plotMargin, 18, ` font-size="13"`, title)
	step := tickStep(maxMS)
	for ms := 0.0; ms <= maxMS; ms += step {
		w(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="#ccc"/>`+"\n", x(ms), plotTop-5, x(ms), axisY)
		text(x(ms), axisY+12, ` text-anchor="middle"`, fmt.Sprintf("%.0f", ms))
	}
	text(plotLeft+plotWidth/2-40, axisY+26, "", "ms after the fault")
	for i, r := range rep.Records {
		rep.plotRow(w, text, x, float64(plotTop+i*plotRow), r)
	}
	y := axisY + 26 + legendLine
	for _, l := range legend {
		if l.color != "" {
			w(`<rect x="%d" y="%.1f" width="10" height="8" fill="%s" fill-opacity="%.2f"/>`+"\n", plotMargin, y-8, l.color, l.opacity)
		}
		text(plotMargin+14, y, "", l.text)
		y += legendLine
	}
	io.WriteString(f, "</svg>\n")
	return f.Flush()
}

// plotRow draws one iteration's label and bars at y.
func (rep Report) plotRow(w func(string, ...any), text func(x, y float64, attrs, s string), x func(float64) float64, y float64, r Record) {
	label := ""
	if !r.Passed {
		label = ` font-weight="bold"`
		w(`<rect x="%d" y="%.1f" width="%d" height="%d" fill="#fdd"/>`+"\n", plotMargin-2, y, plotLeft-plotMargin-4, plotRow-2)
	}
	text(plotMargin, y+12, label, fmt.Sprintf("%d %s", r.Iteration, r.Fault))
	for _, b := range plotBars {
		from, to, ok := b.span(r)
		if !ok {
			continue
		}
		barY, barH, extra := y+2, 6.0, ""
		switch b.term {
		case TermGuestPause:
			barY = y + 9
		case TermBothServing:
			barY, barH, extra = y, plotRow-2, ` class="both-serving"`
		}
		w(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.0f" fill="%s" fill-opacity="%.2f"%s><title>%s %.1f ms, from +%.1f ms</title></rect>`+"\n",
			x(from), barY, max(1, x(to)-x(from)), barH, b.color, b.opacity(), extra, b.term, to-from, from)
	}
}

// legendEntry is a line of the plot's legend: a colour swatch (none for
// a note) and its text.
type legendEntry struct {
	color   string
	opacity float64
	text    string
}

func (rep Report) legend() []legendEntry {
	var l []legendEntry
	for _, b := range plotBars {
		l = append(l, legendEntry{b.color, b.opacity(), fmt.Sprintf("%s: %s", b.term, b.term.Meaning())})
	}
	return append(l, legendEntry{"", 1, fmt.Sprintf("the upper bar ends at the %s: %s", TermTakeover, TermTakeover.Meaning())},
		legendEntry{"#fdd", 1, "a failed iteration"})
}

// opacity is the bar's: the both-serving window is a band behind the
// others.
func (b plotBar) opacity() float64 {
	if b.term == TermBothServing {
		return 0.35
	}
	return 1
}

// plotSpan is the time axis' length in ms: every bar fits.
func (rep Report) plotSpan() float64 {
	maxMS := 100.0
	for _, r := range rep.Records {
		for _, b := range plotBars {
			if _, to, ok := b.span(r); ok {
				maxMS = max(maxMS, to)
			}
		}
	}
	return maxMS * 1.1
}

// canvas is the plot's size: wide enough for the axis, the title and
// the longest legend line; tall enough for the rows, the axis and the
// legend.
func (rep Report) canvas(title string, legend []legendEntry, axisY float64) (w, h float64) {
	w = max(plotLeft+plotWidth+30, 2*plotMargin+float64(len([]rune(title)))*titleCharWidth)
	for _, l := range legend {
		w = max(w, 2*plotMargin+14+float64(len([]rune(l.text)))*charWidth)
	}
	return w, axisY + 26 + legendLine*float64(len(legend)+1)
}

// tickStep is the time axis' grid step for a span of maxMS: about ten
// lines.
func tickStep(maxMS float64) float64 {
	for _, s := range []float64{10, 20, 50, 100, 200, 500, 1000, 2000, 5000} {
		if maxMS/s <= 12 {
			return s
		}
	}
	return 10000
}
