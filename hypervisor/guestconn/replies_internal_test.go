package guestconn

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"
)

// pendingInput is a reader whose Buffered count the test sets: whether the
// guest "has sent more".
type pendingInput struct{ n int }

func (p *pendingInput) Buffered() int { return p.n }

// leaseHeld is a node whose lease never runs out; a test of the reply
// queue asks it nothing else.
type leaseHeld struct{ Node }

func (leaseHeld) LeaseExpired() bool { return false }

// replyWire is a connection whose far end the test reads reply bytes from.
func replyWire(t *testing.T, more int) (*guestConn, <-chan string) {
	t.Helper()
	c, far := pipeConn(t, more, Config{ReplyQueueBytes: 1 << 20})
	got := make(chan string, 16)
	go func() {
		buf := make([]byte, 64)
		for {
			n, err := far.Read(buf)
			if n > 0 {
				got <- string(buf[:n])
			}
			if err != nil {
				close(got)
				return
			}
		}
	}()
	return c, got
}

// pipeConn is a connection under cfg over an in-memory pipe, and the
// pipe's far end (the guest's), which the test reads or leaves unread.
func pipeConn(t *testing.T, more int, cfg Config) (*guestConn, net.Conn) {
	t.Helper()
	near, far := net.Pipe()
	c := &guestConn{e: &Edge{node: leaseHeld{}, cfg: cfg}, conn: near, br: &pendingInput{n: more},
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	c.bw = c.newWriter(4096)
	c.replies.cond.L = &c.replies.mu
	t.Cleanup(func() { near.Close(); far.Close() })
	return c, far
}

// gate is a held function the test opens (true) or fails (false).
func gate() (held func() bool, open chan bool) {
	open = make(chan bool, 1)
	return func() bool { return <-open }, open
}

func nothingWithin(t *testing.T, got <-chan string, d time.Duration) {
	t.Helper()
	select {
	case s := <-got:
		t.Fatalf("%q sent while an earlier reply was held", s)
	case <-time.After(d):
	}
}

func readAll(t *testing.T, got <-chan string, want string) {
	t.Helper()
	var s string
	deadline := time.After(5 * time.Second)
	for len(s) < len(want) {
		select {
		case part, ok := <-got:
			if !ok {
				t.Fatalf("connection closed after %q, want %q", s, want)
			}
			s += part
		case <-deadline:
			t.Fatalf("got %q, want %q", s, want)
		}
	}
	if s != want {
		t.Fatalf("got %q, want %q", s, want)
	}
}

// TestHeldRepliesKeepOrder: while the guest has sent more, a held reply is
// queued and the connection goes on; replies behind it, held or not, wait
// for it, and all go out in order once it may.
func TestHeldRepliesKeepOrder(t *testing.T) {
	c, got := replyWire(t, 1)
	heldA, openA := gate()
	heldC, openC := gate()
	queued := make(chan bool)
	go func() {
		ok := c.reply([]byte("A"), heldA) && c.reply([]byte("B"), nil) && c.reply([]byte("C"), heldC)
		queued <- ok
	}()
	select {
	case ok := <-queued:
		if !ok {
			t.Fatal("a reply was refused")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the connection waited with a held reply while the guest had sent more")
	}
	nothingWithin(t, got, 50*time.Millisecond)
	openC <- true // C may go, but not before A
	nothingWithin(t, got, 50*time.Millisecond)
	openA <- true
	readAll(t, got, "ABC")
	if err := c.settle(); err != nil {
		t.Fatal(err)
	}
	c.drainReplies()
}

// TestRefusedHeldReplyEndsConnection: a held reply that may never go (the
// node is going down) is not sent, nor is anything behind it, and the
// connection closes.
func TestRefusedHeldReplyEndsConnection(t *testing.T) {
	c, got := replyWire(t, 1)
	heldA, openA := gate()
	c.reply([]byte("A"), heldA)
	c.reply([]byte("B"), nil)
	openA <- false
	select {
	case s, ok := <-got:
		if ok {
			t.Fatalf("%q sent after a refused reply", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("connection still open after a refused reply")
	}
	if c.reply([]byte("C"), nil) {
		t.Fatal("a reply was accepted after the connection ended")
	}
	if c.settle() == nil {
		t.Fatal("settle reported nothing wrong after a refused reply")
	}
	c.drainReplies()
}

// TestHeldReplyWaitsInPlace: with nothing more from the guest, a held
// reply waits on the connection's own goroutine (no queue).
func TestHeldReplyWaitsInPlace(t *testing.T) {
	c, got := replyWire(t, 0)
	held, open := gate()
	done := make(chan bool)
	go func() { done <- c.reply([]byte("A"), held) }()
	select {
	case <-done:
		t.Fatal("reply returned before it could go")
	case <-time.After(50 * time.Millisecond):
	}
	open <- true
	if !<-done {
		t.Fatal("reply refused")
	}
	c.replies.mu.Lock()
	started := c.replies.started
	c.replies.mu.Unlock()
	if started {
		t.Fatal("a reply of a guest that waits for each was handed to the sending goroutine")
	}
	go c.settle()
	readAll(t, got, "A")
}

// TestUnreadRepliesStopReading: once the connection's queued replies hold
// more than ReplyQueueBytes, a reply does not return (the connection reads
// no further request) until replies went out; then it does.
func TestUnreadRepliesStopReading(t *testing.T) {
	frame := bytes.Repeat([]byte{'r'}, 100)
	cost := queuedReply{frame: frame}.cost()
	c, far := pipeConn(t, 1, Config{ReplyQueueBytes: 2*cost + cost/2})
	held, open := gate()
	if !c.reply(frame, held) || !c.reply(frame, nil) { // two replies queued, the first held
		t.Fatal("a reply within the bound was refused")
	}
	returned := make(chan bool, 1)
	go func() { returned <- c.reply(frame, nil) }() // a third: over the bound
	select {
	case <-returned:
		t.Fatal("the connection went on reading with more than ReplyQueueBytes queued")
	case <-time.After(50 * time.Millisecond):
	}
	open <- true
	go io.Copy(io.Discard, far) // the guest reads its replies
	select {
	case ok := <-returned:
		if !ok {
			t.Fatal("the reply was refused once the guest read")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the connection still waits after the guest read its replies")
	}
	if err := c.settle(); err != nil {
		t.Fatal(err)
	}
	c.drainReplies()
	if n := c.e.QueuedReplyBytes(); n != 0 {
		t.Fatalf("%d reply bytes still counted queued", n)
	}
}

// TestWriteTimeoutEndsConnection: a guest that reads none of its replies
// for WriteTimeout loses its connection, whether the reply was written by
// the connection itself or by the sending goroutine.
func TestWriteTimeoutEndsConnection(t *testing.T) {
	cfg := Config{ReplyQueueBytes: 1 << 20, WriteTimeout: 100 * time.Millisecond}
	direct, _ := pipeConn(t, 0, cfg)
	frame := bytes.Repeat([]byte{'r'}, 8192) // past the 4 KiB writer's buffer: written at once
	if direct.reply(frame, nil) {
		t.Fatal("a reply nobody read was reported written")
	}
	queued, _ := pipeConn(t, 1, cfg)
	held, open := gate()
	queued.reply(frame, held)
	open <- true
	if err := queued.settle(); err == nil {
		t.Fatal("settle reported nothing wrong for a reply nobody read")
	}
	if queued.reply(frame, nil) {
		t.Fatal("a reply was accepted after the connection ended")
	}
	queued.drainReplies()
	if n := queued.e.QueuedReplyBytes(); n != 0 {
		t.Fatalf("%d reply bytes still counted queued after the connection ended", n)
	}
}

// TestReplyInParts: a reply given as a head and a tail (a large read's
// data, sent from where it lies) reaches the guest as one frame, head
// then tail, whether written at once or queued behind a held reply, and
// in order with the replies around it.
func TestReplyInParts(t *testing.T) {
	for _, more := range []int{0, 1} { // 1: the guest has sent more, so a held reply queues
		c, got := replyWire(t, more)
		held, open := gate()
		open <- true
		done := make(chan bool)
		go func() {
			done <- c.reply([]byte("A"), held) && c.replyParts([]byte("head:"), []byte("tail"), held) && c.reply([]byte("B"), nil)
		}()
		open <- true
		if !<-done {
			t.Fatal("a reply was refused")
		}
		if err := c.settle(); err != nil {
			t.Fatal(err)
		}
		if err := c.bw.Flush(); err != nil { // the connection flushes once it has nothing to read
			t.Fatal(err)
		}
		readAll(t, got, "Ahead:tailB")
	}
}
