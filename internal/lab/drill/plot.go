package drill

import (
	"bufio"
	"fmt"
	"io"
)

// WriteSVG draws the drill as a timeline: one row per iteration, time
// from the moment the fault struck. The red bar is the standby's wait until
// its detector fired and it served guests; the blue bar is the guest's pause
// (lost connection to resumed session).
func (rep Report) WriteSVG(out io.Writer) error {
	f := bufio.NewWriter(out)
	maxMS := 100.0
	for _, r := range rep.Records {
		maxMS = max(maxMS, r.PromotionMS, r.PauseMS)
	}
	maxMS *= 1.1
	const left, width, row, top = 170, 640, 16, 40
	height := top + row*len(rep.Records) + 50
	x := func(ms float64) float64 { return left + ms/maxMS*width }
	w := func(format string, a ...any) { fmt.Fprintf(f, format, a...) }
	w(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", left+width+30, height)
	w(`<text x="10" y="18" font-size="13">vgpuha drill, mode %s: %d/%d passed, %d requests lost; detection p50 %.0f ms, guest pause p50 %.0f ms</text>`+"\n",
		rep.Mode, rep.Passed, rep.Iterations, rep.LostRequests, rep.DetectionMS.P50, rep.PauseMS.P50)
	for ms := 0.0; ms <= maxMS; ms += 50 {
		w(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/><text x="%.1f" y="%d" text-anchor="middle">%.0f</text>`+"\n",
			x(ms), top-5, x(ms), height-40, x(ms), height-28, ms)
	}
	w(`<text x="%d" y="%d">ms after the fault</text>`+"\n", left+width/2-40, height-12)
	for i, r := range rep.Records {
		y := top + i*row
		color := "black"
		if !r.Passed {
			color = "#c00"
		}
		w(`<text x="10" y="%d" fill="%s">%d %s</text>`+"\n", y+11, color, r.Iteration, r.Fault)
		if r.PromotionMS > 0 {
			w(`<rect x="%.1f" y="%d" width="%.1f" height="6" fill="#d33"><title>serving after %.1f ms</title></rect>`+"\n", x(0), y+2, x(r.PromotionMS)-x(0), r.PromotionMS)
		}
		if r.PauseMS > 0 {
			w(`<rect x="%.1f" y="%d" width="%.1f" height="6" fill="#36c"><title>guest paused %.1f ms</title></rect>`+"\n", x(0), y+8, max(1, x(r.PauseMS)-x(0)), r.PauseMS)
		}
	}
	w(`<rect x="%d" y="%d" width="10" height="6" fill="#d33"/><text x="%d" y="%d">fault to new primary serving</text>`+"\n", left, height-8, left+14, height-2)
	w(`<rect x="%d" y="%d" width="10" height="6" fill="#36c"/><text x="%d" y="%d">guest pause</text>`+"\n", left+200, height-8, left+214, height-2)
	io.WriteString(f, "</svg>\n")
	return f.Flush()
}
