package drill

import (
	"bytes"
	"encoding/xml"
	"io"
	"strconv"
	"strings"
	"testing"
)

// svgElement is an element of the plot as parsed back, with the
// attributes the test checks.
type svgElement struct {
	name  string
	attrs map[string]string
	text  string
}

func (e svgElement) num(t *testing.T, attr string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(e.attrs[attr], 64)
	if err != nil {
		t.Fatalf("<%s %s=%q>: %v", e.name, attr, e.attrs[attr], err)
	}
	return v
}

// parseSVG parses the plot back: the root and every element under it, in
// order.
func parseSVG(t *testing.T, svg []byte) (root svgElement, els []svgElement) {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(svg))
	var open []*svgElement
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("the plot is not XML: %v\n%s", err, svg)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			e := svgElement{name: tok.Name.Local, attrs: map[string]string{}}
			for _, a := range tok.Attr {
				e.attrs[a.Name.Local] = a.Value
			}
			els = append(els, e)
			open = append(open, &els[len(els)-1])
		case xml.CharData:
			if len(open) > 0 {
				open[len(open)-1].text += string(tok)
			}
		case xml.EndElement:
			open = open[:len(open)-1]
		}
	}
	if len(els) == 0 || els[0].name != "svg" {
		t.Fatalf("no <svg> root:\n%s", svg)
	}
	return els[0], els[1:]
}

// TestWriteSVG renders a hand-made report: an opaque white background
// covers the whole canvas, every text is dark, the legend names every
// bar's term with its meaning and fits on the canvas, and the iteration
// in which both nodes served has its window drawn, inside the canvas.
func TestWriteSVG(t *testing.T) {
	rep := summarize(Options{Mode: "commit"}, []Record{
		{Iteration: 1, Fault: "kill", Passed: true, Failovers: 1, SilenceMS: 281, DetectionMS: 275, PromotionMS: 20, TakeoverMS: 295, PauseMS: 290, PauseFromMS: 3},
		{Iteration: 2, Fault: "partition", Passed: true, Failovers: 1, DetectionMS: 270, PromotionMS: 25, TakeoverMS: 295, PauseMS: 120, PauseFromMS: 360,
			BothServingMS: 62.6, BothServingFromMS: 297},
		{Iteration: 3, Fault: "freeze", Failovers: 0, Problem: "standby was not promoted"},
	})
	var b bytes.Buffer
	if err := rep.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	root, els := parseSVG(t, b.Bytes())
	width, height := root.num(t, "width"), root.num(t, "height")
	if bg := els[0]; bg.name != "rect" || bg.attrs["fill"] != "#fff" || bg.num(t, "x") != 0 || bg.num(t, "y") != 0 ||
		bg.num(t, "width") != width || bg.num(t, "height") != height {
		t.Errorf("first element %+v, want a white rect over the whole %vx%v canvas", bg, width, height)
	}
	inside := func(what string, x0, y0, x1, y1 float64) {
		if x0 < 0 || y0 < 0 || x1 > width || y1 > height {
			t.Errorf("%s spans (%.1f,%.1f)-(%.1f,%.1f), outside the %vx%v canvas", what, x0, y0, x1, y1, width, height)
		}
	}
	var texts []string
	both := 0
	for _, e := range els {
		switch {
		case e.name == "text":
			if e.attrs["fill"] != ink {
				t.Errorf("text %q is %q, want %s", e.text, e.attrs["fill"], ink)
			}
			x, y := e.num(t, "x"), e.num(t, "y")
			if e.attrs["text-anchor"] != "middle" {
				inside("text "+strconv.Quote(e.text), x, y-11, x+float64(len([]rune(e.text)))*charWidth, y)
			}
			texts = append(texts, e.text)
		case e.attrs["class"] == "both-serving":
			both++
			x, y := e.num(t, "x"), e.num(t, "y")
			inside("the both-serving window", x, y, x+e.num(t, "width"), y+e.num(t, "height"))
		}
	}
	if both != 1 {
		t.Errorf("%d both-serving windows drawn, want 1 (iteration 2's):\n%s", both, b.String())
	}
	all := strings.Join(texts, "\n")
	for _, tm := range []Term{TermDetection, TermPromotion, TermGuestPause, TermBothServing, TermTakeover} {
		if !strings.Contains(all, tm.Meaning()) {
			t.Errorf("the legend lacks %s (%q):\n%s", tm, tm.Meaning(), all)
		}
	}
}

// TestTickStep: the time axis has at most a dozen grid lines.
func TestTickStep(t *testing.T) {
	for _, maxMS := range []float64{110, 330, 1000, 2500, 9000, 60000} {
		if n := maxMS / tickStep(maxMS); n > 12 {
			t.Errorf("%v ms: step %v, %v lines", maxMS, tickStep(maxMS), n)
		}
	}
}
