package worker

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"testing"
)

// writes records each Write it is given.
type writes [][]byte

func (w *writes) Write(p []byte) (int, error) {
	*w = append(*w, append([]byte(nil), p...))
	return len(p), nil
}

// TestHeldFramesGoTogether: while holding, asynchronous frames are not
// written until the next frame that is not one (then in the same write,
// ahead of it), holdBytes of them, or a flush; not holding, each goes at
// once.
func TestHeldFramesGoTogether(t *testing.T) {
	reply := sealFrame(appendReply(appendFrame(nil), nil, 0))
	var w writes
	l := link{w: &w, r: bufio.NewReader(bytes.NewReader(bytes.Repeat(reply, 2)))}
	launch := func() { l.roundTrip(append(l.start(opLaunch, flagAsync), make([]byte, 100)...)) }

	l.hold = true
	for range 3 {
		launch()
	}
	if len(w) != 0 {
		t.Fatalf("%d writes of held launches, want none yet", len(w))
	}
	if _, err := l.ask(opSync); err != nil {
		t.Fatal(err)
	}
	if len(w) != 1 || frames(t, w[0]) != 4 || w[0][len(w[0])-2] != byte(opSync) {
		t.Fatalf("writes %d, frames in the first %d: want one write of the 3 launches, then the sync", len(w), frames(t, w[0]))
	}

	w = nil
	const frameBytes = 4 + 2 + 100 // length, op and flags, body
	for range (holdBytes + frameBytes - 1) / frameBytes {
		launch()
	}
	if len(w) != 1 || len(l.held) != 0 {
		t.Fatalf("%d writes, %d bytes held after %d bytes of launches: want one write once %d were held", len(w), len(l.held), holdBytes, holdBytes)
	}
	w = nil
	launch()
	if err := l.flush(); err != nil || len(w) != 1 || frames(t, w[0]) != 1 {
		t.Fatalf("flush: %v, %d writes: want the held launch written", err, len(w))
	}

	w, l.hold = nil, false
	launch()
	launch()
	if len(w) != 2 {
		t.Fatalf("%d writes of 2 launches not held, want 2", len(w))
	}
}

// frames counts the frames in b.
func frames(t *testing.T, b []byte) int {
	t.Helper()
	n := 0
	for len(b) > 0 {
		if len(b) < 4 {
			t.Fatalf("a frame cut short: %d bytes", len(b))
		}
		size := 4 + int(binary.LittleEndian.Uint32(b))
		if size > len(b) {
			t.Fatalf("a frame of %d bytes in %d", size, len(b))
		}
		b, n = b[size:], n+1
	}
	return n
}
