package pvdriver

import (
	"fmt"
	"time"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Reads behind a wait. A guest library that mirrors host memory on the
// device (cuMemHostGetDevicePointer) reads every mirror back after each
// call that waits for the device. Sent one after another, each read was a
// round trip of its own: a ResNet step whose process held two mirrors paid
// three round trips for each of its waits. Here the wait and the reads go
// out before any reply is awaited; the node runs a session's requests in
// order, so each read sees the device as the wait left it, and all of them
// cost one round trip.

// Sent is the id of the newest request the client has sent. Ids are
// consecutive and only grow, so two readings that agree mean no request
// went out between them (a guest library uses that to know a stream it
// saw idle is still idle).
func (c *Client) Sent() uint64 { return c.nextID.Load() }

// Read is a device range to read into Dst.
type Read struct {
	Dst []byte
	Src DevicePtr
}

// ReadError is a read behind a wait that failed where the wait succeeded.
type ReadError struct{ Err error }

func (e *ReadError) Error() string { return "reading back after a wait: " + e.Err.Error() }
func (e *ReadError) Unwrap() error { return e.Err }

// SynchronizeThenRead is Synchronize followed by reads, in one round trip.
// The wait's error comes first; where the wait succeeded and a read did
// not, the error is a *ReadError. A failed read leaves its Dst unspecified.
func (c *Client) SynchronizeThenRead(reads []Read) error {
	return c.callThenRead(&inFlight{op: abi.OpSync}, &abi.Sync{}, reads)
}

// StreamSynchronizeThenRead is StreamSynchronize(s) followed by reads, in
// one round trip (see SynchronizeThenRead).
func (c *Client) StreamSynchronizeThenRead(s Stream, reads []Read) error {
	return c.callThenRead(&inFlight{op: abi.OpStreamSync}, &abi.StreamSync{Stream: uint64(s)}, reads)
}

// CopyDtoHThenRead is CopyDtoH(dst, src) followed by reads, in one round
// trip where the copy fits one reply frame and goes inline; otherwise the
// copy runs as CopyDtoH does and the reads follow it in a round trip of
// their own (see SynchronizeThenRead).
func (c *Client) CopyDtoHThenRead(dst []byte, src DevicePtr, reads []Read) error {
	if _, inRegion := c.hostOffset(dst); inRegion || len(dst) > c.chunk() {
		if err := c.CopyDtoH(dst, src); err != nil {
			return err
		}
		return c.callThenRead(nil, nil, reads)
	}
	main := &inFlight{op: abi.OpCopyDtoH, read: &Read{Dst: dst, Src: src}}
	return c.callThenRead(main, &abi.CopyDtoH{Src: uint64(src), Size: uint64(len(dst))}, reads)
}

// inFlight is a call sent and not yet awaited; read is set for a copy to
// the host.
type inFlight struct {
	op    abi.Opcode
	rr    *replyReader
	drive bool
	ch    chan result
	read  *Read
	data  abi.DataReply
}

// sendCall submits f as a call with request req; a read's reply is to be
// placed in its Dst (expectInto). Its frame goes at once if flush is set;
// else it may wait in the writer's buffer until flushHeld, so that calls
// sent together reach the node in one write (and their replies come back
// in one).
func (c *Client) sendCall(f *inFlight, req abi.Body, flush bool) error {
	f.ch = make(chan result, 1)
	if f.read != nil {
		c.expectInto(f.ch, f.read.Dst)
	}
	var err error
	f.rr, f.drive, err = c.submitFlushed(f.op, req, 0, f.ch, flush)
	if err != nil && f.read != nil {
		c.forgetInto(f.ch)
	}
	return err
}

// readBurst: a caller that holds the reading turn for the first of calls
// it sent together reads on until every one of them is answered, then
// gives the turn back. Given back after the first reply, as a single
// call's wait does, the turn went to the reader goroutine, which handed
// each further reply over: a wake-up of this thread apiece. The time
// counts as the first call's wait.
func (c *Client) readBurst(sent []*inFlight) {
	if len(sent) < 2 || !sent[0].drive {
		return
	}
	start := time.Now()
	rr := sent[0].rr
	for !answered(sent) && c.readReply(rr, false) {
	}
	c.releaseTurn(rr)
	sent[0].drive = false
	for _, f := range sent {
		if len(f.ch) > 0 {
			c.stats.ownReads.Add(1)
		}
	}
	c.stats.addWait(sent[0].op, time.Since(start))
}

// answered reports whether every call of sent has its reply.
func answered(sent []*inFlight) bool {
	for _, f := range sent {
		if len(f.ch) == 0 {
			return false
		}
	}
	return true
}

// awaitCall waits for f's reply, copying a read's bytes into its Dst
// where the reader did not place them there.
func (c *Client) awaitCall(f *inFlight) error {
	var reply abi.Body
	if f.read != nil {
		reply = &f.data
		defer c.forgetInto(f.ch)
	}
	placed, err := c.finishPlaced(f.op, reply, f.rr, f.drive, f.ch)
	if err != nil || placed || f.read == nil {
		return err
	}
	if len(f.data.Data) != len(f.read.Dst) {
		return fmt.Errorf("pvdriver: copy_dtoh returned %d bytes, want %d", len(f.data.Data), len(f.read.Dst))
	}
	copy(f.read.Dst, f.data.Data)
	return nil
}

// callThenRead sends main (with request req; none if nil), then a
// copy_dtoh call for each read that fits one reply frame, and only then
// awaits every reply, in order; a read larger than a frame is read after
// them (CopyDtoH). The calls go in one write, so that the node reads them
// together and answers them in one (a 4-byte read with two behind it took
// 160-167 µs on the 2-core VM with each frame flushed alone, the read
// alone 35-41 µs). main's error comes first, then a read's as a
// *ReadError. Every call sent is awaited.
func (c *Client) callThenRead(main *inFlight, req abi.Body, reads []Read) error {
	var sent []*inFlight
	var mainErr, readErr error
	if main != nil {
		if mainErr = c.sendCall(main, req, false); mainErr != nil {
			return mainErr
		}
		sent = append(sent, main)
	}
	var large []Read
	for i := range reads {
		if len(reads[i].Dst) > c.chunk() {
			large = append(large, reads[i])
			continue
		}
		f := &inFlight{op: abi.OpCopyDtoH, read: &reads[i]}
		if readErr = c.sendCall(f, &abi.CopyDtoH{Src: uint64(reads[i].Src), Size: uint64(len(reads[i].Dst))}, false); readErr != nil {
			break
		}
		sent = append(sent, f)
	}
	c.flushHeld()
	c.readBurst(sent)
	for _, f := range sent {
		err := c.awaitCall(f)
		switch {
		case f == main:
			mainErr = err
		case readErr == nil:
			readErr = err
		}
	}
	for _, r := range large {
		if readErr != nil {
			break
		}
		readErr = c.CopyDtoH(r.Dst, r.Src)
	}
	if mainErr != nil {
		return mainErr
	}
	if readErr != nil {
		return &ReadError{Err: readErr}
	}
	return nil
}
