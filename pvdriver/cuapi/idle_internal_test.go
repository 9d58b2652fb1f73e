package cuapi

import (
	"testing"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// TestIdleStreamsAnsweredHere: a stream's synchronisation (or an event
// recorded on it, which waits for it) goes to the node unless nothing at
// all was sent since a wait that covered the stream: a synchronisation of
// it, a copy to the host or a context synchronisation (which cover every
// stream). Any request in between, device work on another stream
// included, sends the next one.
func TestIdleStreamsAnsweredHere(t *testing.T) {
	d, th, _ := driverWithContext(t)
	syncs := func() uint64 { // synchronisations the node was sent
		var n uint64
		for _, s := range d.client.Stats() {
			if s.Op == abi.OpStreamSync || s.Op == abi.OpSync {
				n += s.Sent
			}
		}
		return n
	}
	s, r := d.StreamCreate(th, 0)
	other, r2 := d.StreamCreate(th, 0)
	p, r3 := d.MemAlloc(th, 4096)
	ev, r4 := d.EventCreate(th, 0)
	if r != Success || r2 != Success || r3 != Success || r4 != Success {
		t.Fatalf("set-up: %d %d %d %d", r, r2, r3, r4)
	}
	buf := make([]byte, 16)
	for i, step := range []struct {
		name string
		do   func() Result
		sent uint64 // synchronisations sent by this step
	}{
		{"first synchronisation", func() Result { return d.StreamSynchronize(th, s) }, 1},
		{"again, nothing sent since", func() Result { return d.StreamSynchronize(th, s) }, 0},
		{"work on another stream", func() Result { return d.Memset(th, p, 1, 7, 4096, other, true) }, 0},
		{"synchronisation after it", func() Result { return d.StreamSynchronize(th, s) }, 1},
		{"work on the stream", func() Result { return d.Memset(th, p, 1, 8, 4096, s, true) }, 0},
		{"a copy to the host", func() Result { return d.MemcpyDtoH(th, buf, p, s) }, 0},
		{"synchronisation after the copy", func() Result { return d.StreamSynchronize(th, s) }, 0},
		{"the null stream, too", func() Result { return d.StreamSynchronize(th, 0) }, 0},
		{"the other stream, too", func() Result { return d.StreamSynchronize(th, other) }, 0},
		{"work, then the context", func() Result { d.Memset(th, p, 1, 9, 4096, s, true); return d.CtxSynchronize(th) }, 1},
		{"synchronisation after the context's", func() Result { return d.StreamSynchronize(th, s) }, 0},
		{"an event recorded on the idle stream", func() Result { return d.EventRecord(th, ev, s) }, 0},
		{"work, then an event", func() Result { d.Memset(th, p, 1, 8, 4096, s, true); return d.EventRecord(th, ev, s) }, 1},
	} {
		before := syncs()
		if r := step.do(); r != Success {
			t.Fatalf("step %d (%s): %d", i, step.name, r)
		}
		if got := syncs() - before; got != step.sent {
			t.Errorf("step %d (%s): %d synchronisations sent, want %d", i, step.name, got, step.sent)
		}
	}
	if buf[0] != 8 {
		t.Errorf("the copy read %d, want 8", buf[0])
	}
}
