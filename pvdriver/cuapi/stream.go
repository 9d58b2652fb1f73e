package cuapi

import (
	"time"

	"github.com/vgpuha/vgpuha/pvdriver"
)

// Streams and events. An event is recorded by waiting for its stream's
// work and taking the time: the event is complete once cuEventRecord
// returns, cuStreamWaitEvent has nothing left to wait for, and
// cuEventElapsedTime measures between the completions the program saw.
// An error of the stream's earlier work surfaces at that record, and again
// at the stream's next synchronization, so none is lost.

// The special stream handles of cuda.h.
const (
	streamLegacy    = 1 // CU_STREAM_LEGACY
	streamPerThread = 2 // CU_STREAM_PER_THREAD (served as the legacy stream)
)

// CU_EVENT_DISABLE_TIMING.
const eventDisableTiming = 0x2

type stream struct {
	ctx    uint64
	flags  uint32
	remote pvdriver.Stream
	sticky Result // an error a record reported, for the next synchronization
}

type event struct {
	ctx      uint64
	flags    uint32
	recorded bool
	at       time.Time
}

// stream resolves a CUstream (0, legacy and per-thread: the null stream).
// Precondition: d.mu must be locked.
func (d *Driver) stream(s uint64) (pvdriver.Stream, Result) {
	if s == 0 || s == streamLegacy || s == streamPerThread {
		return 0, Success
	}
	st := d.streams[s]
	if st == nil {
		return 0, ErrorInvalidHandle
	}
	return st.remote, Success
}

// StreamCreate is cuStreamCreate (flags: CU_STREAM_DEFAULT or
// CU_STREAM_NON_BLOCKING).
func (d *Driver) StreamCreate(t Thread, flags uint32) (uint64, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ctx, r := d.current(t)
	if r != Success {
		return 0, r
	}
	if flags&^1 != 0 {
		return 0, ErrorInvalidValue
	}
	s, err := d.client.CreateStream()
	if err != nil {
		return 0, resultOf("cuStreamCreate", err, false)
	}
	h := d.mint()
	d.streams[h] = &stream{ctx: ctx, flags: flags, remote: s}
	return h, Success
}

// StreamDestroy is cuStreamDestroy_v2.
func (d *Driver) StreamDestroy(t Thread, s uint64) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.ready(); r != Success {
		return r
	}
	st := d.streams[s]
	if st == nil {
		return ErrorInvalidHandle
	}
	if cp := d.captureOf(s); cp != nil { // the capture it was in can no longer end well
		cp.invalid = true
		if cp.origin != s {
			delete(d.captures, s)
		}
	}
	delete(d.streams, s)
	return resultOf("cuStreamDestroy", d.client.DestroyStream(st.remote), false)
}

// StreamSynchronize is cuStreamSynchronize; cuStreamQuery answers the same
// way once the stream's work is done (which it waits for).
func (d *Driver) StreamSynchronize(t Thread, s uint64) Result {
	d.mu.Lock()
	if _, r := d.current(t); r != Success {
		d.mu.Unlock()
		return r
	}
	remote, r := d.stream(s)
	if cp := d.captureOf(s); cp != nil { // a capturing stream cannot be waited for
		cp.invalid = true
		d.mu.Unlock()
		return ErrorCaptureUnsupported
	}
	var sticky Result
	if st := d.streams[s]; st != nil {
		sticky, st.sticky = st.sticky, Success
	}
	c := d.client
	idle := r == Success && d.idleLocked(c, s)
	d.mu.Unlock()
	if r != Success {
		return r
	}
	if idle {
		return sticky // nothing sent since a wait that covered s (idle.go)
	}
	if r := d.syncStream(c, remote, s); r != Success {
		return r
	}
	return sticky
}

// syncStream waits for stream s (0: the null stream; handle is the
// program's), then brings mapped host memory up to date (mapped.go).
func (d *Driver) syncStream(c *pvdriver.Client, s pvdriver.Stream, handle uint64) Result {
	if s == 0 {
		return d.waitAndPull(c, "cuStreamSynchronize", coversAll, c.SynchronizeThenRead)
	}
	return d.waitAndPull(c, "cuStreamSynchronize", handle, func(reads []pvdriver.Read) error {
		return c.StreamSynchronizeThenRead(s, reads)
	})
}

// StreamWaitEvent is cuStreamWaitEvent: recorded events are complete, so
// it only checks its handles.
func (d *Driver) StreamWaitEvent(t Thread, s, ev uint64, flags uint32) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, r := d.current(t); r != Success {
		return r
	}
	if _, r := d.stream(s); r != Success {
		return r
	}
	if d.events[ev] == nil {
		return ErrorInvalidHandle
	}
	d.captureJoin(s, ev)
	return Success
}

// EventCreate is cuEventCreate.
func (d *Driver) EventCreate(t Thread, flags uint32) (uint64, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ctx, r := d.current(t)
	if r != Success {
		return 0, r
	}
	if flags&^0xf != 0 {
		return 0, ErrorInvalidValue
	}
	h := d.mint()
	d.events[h] = &event{ctx: ctx, flags: flags}
	return h, Success
}

// EventRecord is cuEventRecord.
func (d *Driver) EventRecord(t Thread, ev, s uint64) Result {
	d.mu.Lock()
	if _, r := d.current(t); r != Success {
		d.mu.Unlock()
		return r
	}
	e := d.events[ev]
	remote, r := d.stream(s)
	c := d.client
	if e != nil && r == Success && d.captureEventRecord(ev, s) {
		d.mu.Unlock()
		return Success // ordering inside the graph: no node, no wait
	}
	idle := r == Success && d.idleLocked(c, s)
	d.mu.Unlock()
	if e == nil {
		return ErrorInvalidHandle
	}
	if r != Success {
		return r
	}
	if !idle { // an idle stream's work is complete already (idle.go)
		r = d.syncStream(c, remote, s)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if st := d.streams[s]; st != nil && r != Success && st.sticky == Success {
		st.sticky = r
	}
	if d.events[ev] == e {
		e.recorded, e.at = true, time.Now()
	}
	return r
}

// EventQuery is cuEventQuery (and, since a recorded event is complete,
// cuEventSynchronize): Success.
func (d *Driver) EventQuery(ev uint64) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.ready(); r != Success {
		return r
	}
	if d.events[ev] == nil {
		return ErrorInvalidHandle
	}
	return Success
}

// EventElapsedTime is cuEventElapsedTime: milliseconds from start to end.
func (d *Driver) EventElapsedTime(start, end uint64) (float32, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.ready(); r != Success {
		return 0, r
	}
	a, b := d.events[start], d.events[end]
	if a == nil || b == nil || a.flags&eventDisableTiming != 0 || b.flags&eventDisableTiming != 0 {
		return 0, ErrorInvalidHandle
	}
	if !a.recorded || !b.recorded { // cuda.h: an event never recorded is an invalid handle here
		return 0, ErrorInvalidHandle
	}
	return float32(b.at.Sub(a.at).Seconds() * 1000), Success
}

// EventDestroy is cuEventDestroy_v2.
func (d *Driver) EventDestroy(ev uint64) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.ready(); r != Success {
		return r
	}
	if d.events[ev] == nil {
		return ErrorInvalidHandle
	}
	delete(d.events, ev)
	return Success
}
