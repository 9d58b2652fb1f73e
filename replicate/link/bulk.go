package link

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"sync"
)

// InOrder runs a link's bulk frames through two stages: work (sealing or
// opening one frame) runs on up to workers goroutines at once, finish
// (writing it to the link, or handling it) runs one frame at a time in the
// order the frames were submitted, on one goroutine that lives while
// frames are queued (a goroutine per frame waiting for its turn woke every
// waiter at each finish: on the H200 host the link sat idle 40% of a
// catch-up while they were scheduled). A frame's counter, and so its
// nonce, is fixed when it is submitted, so parallel work changes neither
// what goes on the wire nor the order it is read in. Once a finish fails,
// every later finish is told so (to release what it holds) and its frame
// is not written or handled. One goroutine submits (submit, inline).
type InOrder struct {
	slots chan struct{} // one per work running

	mu      sync.Mutex
	drained *sync.Cond      // the queue emptied
	queue   []*orderedFrame // submitted, not yet finished, oldest first
	running bool            // a goroutine runs the queue's finishes
	ok      bool
}

// orderedFrame is a submitted frame: worked is closed once its work
// returned.
type orderedFrame struct {
	worked chan struct{}
	finish func(ok bool) bool
}

// CryptoWorkers is how many frames a link seals or opens at once: one per
// processor, at most maxCryptoWorkers (AES-GCM runs at 2-4 GB/s a core:
// a few keep up with a fast link, more only take cores from guests).
func CryptoWorkers() int { return max(1, min(runtime.GOMAXPROCS(0), maxCryptoWorkers)) }

const maxCryptoWorkers = 4

func NewInOrder(workers int) *InOrder {
	o := &InOrder{slots: make(chan struct{}, workers), ok: true}
	o.drained = sync.NewCond(&o.mu)
	return o
}

// Submit runs work on its own goroutine, once fewer than workers run,
// then finish in turn. finish gets whether every frame before it went
// through, and returns whether its own did.
func (o *InOrder) Submit(work func(), finish func(ok bool) bool) {
	f := o.enqueue(finish)
	o.slots <- struct{}{}
	go func() {
		work()
		<-o.slots
		close(f.worked)
	}()
}

// Inline runs work on the caller and finish after every frame submitted
// before it finished; it returns once finish did.
func (o *InOrder) Inline(work func(), finish func(ok bool) bool) {
	if o.Pending() {
		f := o.enqueue(finish)
		work()
		close(f.worked)
		o.Wait()
		return
	}
	// Nothing queued, and only this goroutine submits: no frame can come
	// between, so work and finish run here, with no goroutine handoff.
	work()
	o.runFinish(finish)
}

// runFinish runs one frame's finish, telling it whether every frame
// before it went through, and notes whether its own did.
func (o *InOrder) runFinish(finish func(ok bool) bool) {
	o.mu.Lock()
	ok := o.ok
	o.mu.Unlock()
	ok = finish(ok) && ok // only this frame's turn: no lock needed
	o.mu.Lock()
	o.ok = ok
	o.mu.Unlock()
}

// enqueue adds a frame to the queue and starts the goroutine that runs
// the finishes if none runs.
func (o *InOrder) enqueue(finish func(ok bool) bool) *orderedFrame {
	f := &orderedFrame{worked: make(chan struct{}), finish: finish}
	o.mu.Lock()
	o.queue = append(o.queue, f)
	start := !o.running
	o.running = true
	o.mu.Unlock()
	if start {
		go o.finishAll()
	}
	return f
}

// finishAll runs the queue's finishes in order, each once its work
// returned, until the queue is empty.
func (o *InOrder) finishAll() {
	o.mu.Lock()
	for len(o.queue) > 0 {
		f := o.queue[0]
		o.mu.Unlock()
		<-f.worked
		o.runFinish(f.finish)
		o.mu.Lock()
		o.queue[0] = nil
		o.queue = o.queue[1:]
	}
	o.running = false
	o.drained.Broadcast()
	o.mu.Unlock()
}

// Wait returns once every frame submitted finished, and whether all went
// through.
func (o *InOrder) Wait() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for len(o.queue) > 0 {
		o.drained.Wait()
	}
	return o.ok
}

// Pending reports whether frames submitted before have yet to finish.
func (o *InOrder) Pending() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.queue) > 0
}

// Last reports, from a finish, whether no frame was submitted after its
// own.
func (o *InOrder) Last() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.queue) <= 1
}

// Failed reports whether a finish failed.
func (o *InOrder) Failed() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return !o.ok
}

// BulkWriter writes a link's records: each frame is sealed on a worker
// under the counter it was given when queued, and written in counter
// order. Frames from fewer than SealApartFrom payload bytes are sealed on
// the caller (a goroutine per small record costs more than it saves) and
// buffered, unless larger frames ahead of them are still in flight: then
// they too wait for their turn on a worker, so the caller goes on
// (sealCopy). Larger frames go to the connection in one write each. A record
// stays its owner's (the log keeps a live one for a standby that
// reconnects; a snapshot's is in a read-ahead buffer): it is sealed into
// the writer's own buffers, one per frame of at most PartBytes, and
// records above that go in parts (record). While a BulkWriter is in use
// it is the link's only writer.
type BulkWriter struct {
	l      *Conn
	frames *InOrder
	err    error // the first write error, set in turn
	// bufs holds the buffers writeCopy seals large frames into, one per
	// frame being sealed or written (a few more than workers: the
	// caller seals the next while others are written).
	bufs chan []byte
}

// SealApartFrom: a frame with at least this many payload bytes is sealed
// on a worker.
const SealApartFrom = 64 << 10

func (l *Conn) Bulk() *BulkWriter {
	workers := CryptoWorkers()
	b := &BulkWriter{l: l, frames: NewInOrder(workers), bufs: make(chan []byte, workers+2)}
	for range cap(b.bufs) {
		b.bufs <- nil // made on first use
	}
	return b
}

// Record queues one record, enc (its encoding), which stays the
// caller's until done is called, once it is written or dropped. A record
// of more than PartBytes goes as a MsgRecordBegin frame (its size) and
// then its encoding in parts of PartBytes, each a frame sealed on a
// worker: the parts of one record are sealed at once, like separate
// records. It returns an error once a write failed, or for a record over
// MaxRecordBytes.
func (b *BulkWriter) Record(enc []byte, done func()) error {
	if len(enc) <= PartBytes {
		return b.writeCopy(MsgRecord, enc, done)
	}
	if len(enc) > MaxRecordBytes {
		done()
		return fmt.Errorf("replicate: a %d-byte record exceeds the link's %d-byte bound", len(enc), MaxRecordBytes)
	}
	if send, err := b.admit(MsgRecord, done); !send {
		return err
	}
	var size [8]byte
	binary.LittleEndian.PutUint64(size[:], uint64(len(enc)))
	b.sealCopy(MsgRecordBegin, size[:], func() {}) // sealed and written before it returns
	for off := 0; off < len(enc); off += PartBytes {
		part := enc[off:min(off+PartBytes, len(enc))]
		partDone := func() {}
		if off+len(part) == len(enc) {
			partDone = done
		}
		b.sealCopy(MsgRecordPart, part, partDone)
	}
	return nil
}

// writeCopy queues one frame whose payload stays the caller's until done
// is called: it is sealed into a buffer of the writer's (the encryption
// is the only pass over it). It returns an error once a write failed.
func (b *BulkWriter) writeCopy(typ uint16, payload []byte, done func()) error {
	if send, err := b.admit(typ, done); !send {
		return err
	}
	b.sealCopy(typ, payload, done)
	return nil
}

// sealCopy seals one frame of the caller's payload (at most PartBytes)
// into a buffer of the writer's, or, when small, into the link's (or one
// of its own while larger frames are in flight).
func (b *BulkWriter) sealCopy(typ uint16, payload []byte, done func()) {
	l := b.l
	need := FrameHeader + len(payload) + MacSize
	switch {
	case len(payload) < SealApartFrom && !b.frames.Pending():
		if cap(l.sealed) < need {
			l.sealed = make([]byte, 0, need)
		}
		// Nothing ahead of it: sealed and written before queue returns,
		// so the buffer is free for the next small frame.
		b.queue(typ, payload, l.sealed[:FrameHeader], l.sealed[FrameHeader:FrameHeader], false, done)
	case len(payload) < SealApartFrom:
		// Frames ahead of it are still being sealed or written. Waiting
		// for them here would hold the caller up: a record's parts,
		// queued after its begin frame, could only start sealing once
		// the last record's parts were written (on the H100 host a gap
		// of ~0.5 ms on the link after every 4 MiB of a resync). Sealed
		// into a buffer of its own, it waits for its turn on a worker.
		buf := make([]byte, 0, need)
		b.queue(typ, payload, buf[:FrameHeader], buf[FrameHeader:FrameHeader], true, done)
	default:
		buf := <-b.bufs
		if cap(buf) < need {
			buf = make([]byte, 0, need)
		}
		b.queue(typ, payload, buf[:FrameHeader], buf[FrameHeader:FrameHeader], true, func() { b.bufs <- buf; done() })
	}
}

// admit reports whether a frame goes out: not once a write failed (it
// returns the error), nor when the fault hook drops it. done is called at
// once for a frame that does not go out.
func (b *BulkWriter) admit(typ uint16, done func()) (bool, error) {
	if b.frames.Failed() {
		done()
		return false, b.err // set before failed() turned true
	}
	l := b.l
	if l.Faults != nil && !l.Faults(Message{From: l.Out, Type: MsgNames[typ], Peer: l.Peer}) {
		done()
		return false, nil
	}
	return true, nil
}

// queue takes the next counter for a frame of payload, seals it into dst
// (which may be payload[:0]; it needs macSize bytes of capacity past the
// payload's length) behind head (frameHeader bytes right before dst), and
// writes the frame in turn: on a worker (apart), else on the caller before
// it returns.
func (b *BulkWriter) queue(typ uint16, payload, head, dst []byte, apart bool, done func()) {
	l := b.l
	h := l.frameHeader(typ, len(payload))
	n := l.takeSendN()
	var out []byte
	seal := func() {
		sealed := l.sealAt(&h, n, dst, payload)
		copy(head, h[:])
		out = head[:FrameHeader+len(sealed)]
	}
	put := func(ok bool) bool {
		if ok {
			ok = b.put(out)
		}
		done()
		return ok
	}
	if apart {
		b.frames.Submit(seal, put)
	} else {
		b.frames.Inline(seal, put)
	}
}

// put writes one sealed frame, in turn: buffered when it fits the
// writer's buffer, else in one write of its own after what is buffered.
func (b *BulkWriter) put(frame []byte) bool {
	w := b.l.w
	if len(frame) > w.Available() && w.Buffered() > 0 {
		if b.err = w.Flush(); b.err != nil {
			return false
		}
	}
	_, b.err = w.Write(frame)
	return b.err == nil
}

// Close waits for every queued frame and returns the first write error.
// What is buffered is left for the link's next flush. The writer may be
// used again unless a write failed.
func (b *BulkWriter) Close() error {
	if !b.frames.Wait() {
		return b.err
	}
	return nil
}
