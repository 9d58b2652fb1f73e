package guestconn

import (
	"bufio"
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
	near, far := net.Pipe()
	c := &guestConn{e: &Edge{node: leaseHeld{}}, conn: near, bw: bufio.NewWriter(near), br: &pendingInput{n: more}}
	c.replies.cond.L = &c.replies.mu
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
	t.Cleanup(func() { near.Close(); far.Close() })
	return c, got
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
