package receiver

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/vgpuha/vgpuha/replicate"
	"github.com/vgpuha/vgpuha/replicate/link"
)

// A Receiver's stream phase (linkRun): reading frames in order, opening
// large ones and record parts on workers, handing each message to its
// handler in turn, and acking; applying is apply.go's.

// linkRun is one admitted link's stream phase: this goroutine reads
// messages, an applier goroutine applies records in order, and an acker
// reports both positions. Reading and applying are apart so that the
// standby acknowledges what it holds while one guest's long kernel is
// being applied (the commit rule waits for what the standby holds, not
// for what it applied).
type linkRun struct {
	r     *Receiver
	l     *link.Conn
	log   *slog.Logger
	kick  chan struct{}  // the stream paused or the applier caught up: ack now
	queue chan applyItem // records read, to apply in order
	// frames opens large frames on workers and hands every frame to its
	// handler in the order read.
	frames *link.InOrder
	// asm is the record being received in parts (the reader's alone).
	asm assembly
}

// assembly is a record arriving in parts: the buffer it is opened into
// (lent; nil when no record is under way), its size, and the bytes of
// its parts read so far.
type assembly struct {
	buf        []byte
	total, got int
}

// applyItem is a record to apply and the lent buffer its body lies in
// (nil when the body was copied).
type applyItem struct {
	rec replicate.Record
	buf []byte
}

// applyQueue bounds the records waiting to be applied (their bytes are
// bounded by maxLentBytes).
const applyQueue = 4096

// streamHandlers handle each message a primary may send once admitted.
// A handler returns false to end the link.
var streamHandlers = map[uint16]func(lr *linkRun, f *link.Frame) bool{
	link.MsgMode:      (*linkRun).onMode,
	link.MsgHeartbeat: (*linkRun).onHeartbeat,
	link.MsgRecord:    (*linkRun).onRecord,
	link.MsgPromote:   (*linkRun).onPromote,
}

// stream reads and handles messages until the link ends, acking what was
// applied whenever the stream pauses and at least every AckInterval. A
// frame of lendAbove bytes or more is opened (decrypted, authenticated) on
// a worker while the next ones are read; every frame is handled in the
// order it was read, under the counter it was read with.
func (r *Receiver) stream(lr *linkRun) {
	done := make(chan struct{})
	defer close(done)
	go lr.acks(done)
	applied := make(chan struct{})
	go lr.applier(applied)
	workers := link.CryptoWorkers()
	lr.frames = link.NewInOrder(workers)
	lr.l.Parts = make(chan []byte, workers+2) // bounds the parts read ahead
	for range cap(lr.l.Parts) {
		lr.l.Parts <- nil // made on first use
	}
	defer func() {
		// Everything read is applied before the link's end is known to
		// the node: a promotion (which waits for it) serves only once the
		// replica holds all the old primary was told is held.
		lr.frames.Wait()
		if lr.asm.buf != nil { // cut off inside a record: none of it is applied
			lr.r.lender.Give(lr.asm.buf)
		}
		close(lr.queue)
		<-applied
	}()
	for !lr.frames.Failed() {
		f, err := lr.l.ReadSealed(lendAbove)
		if err == nil {
			err = lr.dispatch(&f)
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				lr.log.Warn("replication link lost", "err", err)
			}
			return
		}
	}
}

// dispatch has frame f, just read, opened and handled: a record's
// beginning and parts by the assembly (begin, part); a large frame on a
// worker, in turn; a small one here. An error ends the link (frames read
// before f are still handled).
func (lr *linkRun) dispatch(f *link.Frame) error {
	switch typ := f.Type(); {
	case typ == link.MsgRecordBegin:
		return lr.begin(f)
	case typ == link.MsgRecordPart:
		return lr.part(f)
	case lr.asm.buf != nil:
		lr.l.GiveBack(f)
		return fmt.Errorf("%w: a frame of type %d inside a record's parts", link.ErrCorrupt, typ)
	}
	var openErr error
	open := func() {
		if openErr = lr.l.Open(f); openErr == nil && f.Lent && f.Type() == link.MsgRecord {
			sumRecordBody(f) // on the worker, not the applier
		}
	}
	finish := func(ok bool) bool { return lr.finish(f, openErr, ok) }
	if f.Lent {
		lr.frames.Submit(open, finish)
		return nil
	}
	if f.Type() == link.MsgRecord && lr.frames.Pending() {
		// A small record behind large ones still being opened takes a
		// buffer of its own and waits for its turn on a worker, so the
		// link reads on (waiting here for the large ones held a guest's
		// mix of copies and small calls to one record at a time).
		f.Buf = append([]byte(nil), f.Sealed...)
		f.Sealed, f.Owned = f.Buf, true
		lr.frames.Submit(open, finish)
		return nil
	}
	lr.frames.Inline(open, finish)
	if lr.l.Buffered() == 0 {
		lr.ackNow()
	}
	return nil
}

// begin starts a record that arrives in parts: its frame (the record's
// size) is opened here, at once, so that the size is authenticated before
// a buffer of that size is lent.
func (lr *linkRun) begin(f *link.Frame) error {
	defer lr.l.GiveBack(f)
	if lr.asm.buf != nil {
		return fmt.Errorf("%w: a record begins inside another's parts", link.ErrCorrupt)
	}
	if err := lr.l.Open(f); err != nil {
		return err
	}
	if len(f.Payload) != 8 {
		return fmt.Errorf("%w: a %d-byte record beginning", link.ErrCorrupt, len(f.Payload))
	}
	total := binary.LittleEndian.Uint64(f.Payload)
	if total <= link.PartBytes || total > link.MaxRecordBytes {
		return fmt.Errorf("%w: a record in parts of %d bytes (more than %d, at most %d)", link.ErrCorrupt, total, link.PartBytes, link.MaxRecordBytes)
	}
	lr.asm = assembly{buf: lr.l.Lend(int(total)), total: int(total)}
	return nil
}

// part queues the next part of the record under way: a worker opens it
// straight into its place in the record's buffer (and gives its own
// buffer back); in turn, the last part hands the whole record to onRecord.
// A part that fails to open, or any frame before it that failed, ends
// the link and the record is given back unapplied.
func (lr *linkRun) part(f *link.Frame) error {
	a := lr.asm
	n := len(f.Sealed) - link.MacSize
	switch {
	case a.buf == nil:
		lr.l.GiveBack(f)
		return fmt.Errorf("%w: a record part without a record", link.ErrCorrupt)
	case n != min(link.PartBytes, a.total-a.got):
		lr.l.GiveBack(f)
		return fmt.Errorf("%w: a %d-byte record part after %d of %d bytes", link.ErrCorrupt, n, a.got, a.total)
	}
	dst := a.buf[a.got : a.got : a.got+n] // this part's place, only
	lr.asm.got += n
	last := lr.asm.got == a.total
	if last {
		lr.asm = assembly{} // the last part's finish holds the buffer now
	}
	var openErr error
	open := func() {
		openErr = lr.l.OpenInto(f, dst)
		lr.l.GiveBack(f)
	}
	lr.frames.Submit(open, func(ok bool) bool {
		if !last {
			if ok && openErr != nil {
				lr.log.Warn("replication link lost", "err", openErr)
				ok = false
			}
			if !ok {
				lr.l.Raw.Close() // the reader may be waiting for the next frame
			}
			return ok
		}
		rec := link.Frame{Buf: a.buf, Payload: a.buf[:a.total], Lent: true}
		binary.LittleEndian.PutUint16(rec.Header[4:], link.MsgRecord)
		return lr.finish(&rec, openErr, ok)
	})
	return nil
}

// finish handles one frame in its turn (ok: every frame before it was
// handled), gives back its buffer unless a handler kept it, and reports
// whether the link goes on. A frame opened on a worker has an ack sent
// once handled, and closes the link when it ends it: the reader may be
// waiting for the next frame.
func (lr *linkRun) finish(f *link.Frame, openErr error, ok bool) bool {
	switch {
	case !ok:
	case openErr != nil:
		lr.log.Warn("replication link lost", "err", openErr)
		ok = false
	case streamHandlers[f.Type()] == nil:
		lr.log.Warn("unexpected message from primary; dropping link", "type", f.Type())
		ok = false
	default:
		ok = streamHandlers[f.Type()](lr, f)
	}
	lr.l.GiveBack(f)
	if (f.Lent || f.Owned) && ok {
		// Only the last frame read asks for an ack: one behind it asks
		// when its turn comes, and the applier every ackEveryBytes. An
		// ack per large record (12,000 a second while a standby caught
		// up on the H200 host, each waking every waiter on the primary's
		// log) cost the standby 0.55 s of write calls a second; 0.15 s
		// now, the resync as fast.
		if lr.frames.Last() {
			lr.ackNow()
		}
	} else if f.Lent || f.Owned {
		lr.l.Raw.Close() // the reader may be reading on
	}
	return ok
}

// ackNow asks the acker for an ack.
func (lr *linkRun) ackNow() {
	select {
	case lr.kick <- struct{}{}:
	default:
	}
}

func (lr *linkRun) acks(done <-chan struct{}) {
	t := time.NewTicker(lr.r.cfg.AckInterval)
	defer t.Stop()
	var lastReceived, lastApplied uint64
	for {
		tick := false
		select {
		case <-done:
			return
		case <-t.C:
			tick = true // the primary hears from us even when nothing moved
		case <-lr.kick:
		}
		lr.r.mu.Lock()
		received, applied := max(lr.r.received, lr.r.applied), lr.r.applied
		lr.r.mu.Unlock()
		if !tick && received == lastReceived && applied == lastApplied {
			continue
		}
		lastReceived, lastApplied = received, applied
		ack := binary.LittleEndian.AppendUint64(make([]byte, 0, 16+link.MacSize), received)
		if lr.l.WriteFlush(link.MsgAck, binary.LittleEndian.AppendUint64(ack, applied)) != nil {
			lr.l.Raw.Close()
			return
		}
	}
}

func (lr *linkRun) onHeartbeat(f *link.Frame) bool {
	payload := f.Payload
	var term uint64
	if len(payload) == 8 {
		term = binary.LittleEndian.Uint64(payload)
	}
	if lr.stale(term) {
		return false
	}
	lr.r.cfg.Replica.Heard(term)
	return true
}

// onRecord queues a record to apply. A frame read into a lent buffer
// keeps its body there until applied (no copy; on a GPU standby that
// buffer is page-locked); a smaller one's body is copied out of the
// link's buffer, which the next read reuses.
func (lr *linkRun) onRecord(f *link.Frame) bool {
	rec, err := replicate.DecodeRecord(f.Payload)
	if err != nil {
		lr.log.Warn("dropping link", "err", err)
		return false
	}
	if lr.stale(rec.Term) {
		return false
	}
	if f.HasCRC {
		rec.SetBodyCRC(f.BodyCRC)
	}
	lr.r.cfg.Replica.Heard(rec.Term)
	item := applyItem{rec: rec}
	if f.Lent {
		item.buf, f.Buf = f.Buf, nil
	} else {
		item.rec.Body = append([]byte(nil), rec.Body...)
	}
	if rec.Seq != 0 {
		lr.r.mu.Lock()
		lr.r.received = max(lr.r.received, rec.Seq)
		lr.r.mu.Unlock()
	}
	lr.queue <- item
	return true
}

// ackEveryBytes: while the applier works through a backlog it has an ack
// sent each time it applied this many bytes of log records.
const ackEveryBytes = 1 << 20

// onPromote: a planned switchover. The primary has stopped its guests and
// waited for us to apply everything; the node decides whether it takes
// over, and the primary is told the new term.
func (lr *linkRun) onPromote(*link.Frame) bool {
	lr.r.cfg.Replica.Heard(0)
	term, ok := lr.r.cfg.Replica.HandOver()
	if !ok {
		lr.log.Error("switchover refused: this standby has no guest endpoint to take over on")
		return true
	}
	lr.r.mu.Lock()
	lr.r.st.Fenced, lr.r.st.FencedTerm = true, term
	lr.r.mu.Unlock()
	lr.l.WriteFlush(link.MsgFenced, binary.LittleEndian.AppendUint64(make([]byte, 0, 8+link.MacSize), term))
	lr.log.Info("switchover: the primary handed over", "term", term)
	return false
}

// sumRecordBody takes the CRC-32C of the opened record's body when the
// record carries a guest request (replicate.Record.BodyCRC): a worker
// does it while the applier applies the records before.
func sumRecordBody(f *link.Frame) {
	if rec, err := replicate.DecodeRecord(f.Payload); err == nil && rec.ReqID != 0 {
		f.BodyCRC, f.HasCRC = rec.BodyCRC(), true
	}
}
