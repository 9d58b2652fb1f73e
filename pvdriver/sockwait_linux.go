//go:build linux

package pvdriver

import (
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// sockWaiter reads a socket's reply bytes on the calling thread: where
// none are there yet it waits in ppoll(2), up to callerWait, before it
// leaves the wait to Go's network poller (replies.go says why). The reader
// goroutine's idle watch also polls an eventfd, kick, so that a caller
// giving the turn back, or a Close of the connection, wakes it.
//
// A thread in ppoll keeps its P (Go's processor) until the runtime's
// monitor takes it back, 20 µs to 10 ms later; a goroutine readied just
// before, on that P, waits that long. The client's writer is such a
// goroutine when the request waited for went through its queue behind
// pipelined ones: so while writing says frames are queued, Read leaves
// the wait to Go's poller, which gives the P back at once. (A recorded
// training step's replay took 1.4-2.8 times as long before.)
type sockWaiter struct {
	raw syscall.RawConn
	// writing reports that frames wait for the writer goroutine.
	writing func() bool
	mu      sync.Mutex
	// kick is the eventfd; -1 once closed.
	kick int
}

// newSockWaiter is conn's waiter, or nil where conn has no file
// descriptor to poll.
func newSockWaiter(conn net.Conn, writing func() bool) *sockWaiter {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	kick, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil
	}
	return &sockWaiter{raw: raw, writing: writing, kick: kick}
}

// Read reads what the socket has (io.Reader). The descriptor stays
// referenced while it polls, so a Close of the connection waits for that
// poll: it is bounded by callerWait.
func (w *sockWaiter) Read(p []byte) (int, error) {
	var n int
	var readErr error
	polled := w.writing() // then the poller waits, the P free for the writer
	err := w.raw.Read(func(fd uintptr) bool {
		if !polled { // a reply is rarely there already: wait, then read once
			polled = true
			ts := unix.NsecToTimespec(int64(callerWait))
			fds := [1]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			unix.Ppoll(fds[:], &ts, nil)
		}
		n, readErr = unix.Read(int(fd), p)
		return readErr != unix.EAGAIN // else Go's poller waits from here on
	})
	switch {
	case err != nil:
		return 0, err
	case readErr != nil:
		return 0, readErr
	case n == 0 && len(p) > 0:
		return 0, io.EOF
	}
	return n, nil
}

// watch is the reader goroutine's wait while it does not read: for the
// connection's end if end is set (an idle connection), and for a kick
// (taken, so the next watch waits again), at most d.
func (w *sockWaiter) watch(d time.Duration, end bool) (ended bool, err error) {
	w.mu.Lock()
	kick := w.kick
	w.mu.Unlock()
	if end {
		ended, err = w.pollEnd(d, kick)
	} else {
		// Not the socket: it reports its end (POLLHUP) whatever it is asked.
		ts := unix.NsecToTimespec(int64(d))
		fds := [1]unix.PollFd{{Fd: int32(kick), Events: unix.POLLIN}}
		unix.Ppoll(fds[:], &ts, nil)
	}
	var b [8]byte
	unix.Read(kick, b[:]) // drain the kick; EAGAIN if there was none
	return ended, err
}

// pollEnd is ppoll(2) on the socket, for its end, and on kick; ended: the
// socket has ended (POLLRDHUP, or POLLHUP or POLLERR, reported unasked).
func (w *sockWaiter) pollEnd(d time.Duration, kick int) (ended bool, err error) {
	ts := unix.NsecToTimespec(int64(d))
	var pollErr error
	err = w.raw.Control(func(fd uintptr) {
		fds := [2]unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}, {Fd: int32(kick), Events: unix.POLLIN}}
		_, e := unix.Ppoll(fds[:], &ts, nil)
		switch {
		case errors.Is(e, unix.EINTR): // a signal (the runtime's preemption): look again
		case e != nil:
			pollErr = e
		default:
			ended = fds[0].Revents != 0
		}
	})
	if err == nil {
		err = pollErr
	}
	return ended, err
}

// wake kicks the reader goroutine out of its watch.
func (w *sockWaiter) wake() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.kick >= 0 {
		unix.Write(w.kick, []byte{1, 0, 0, 0, 0, 0, 0, 0})
	}
}

// close releases the eventfd (the reader goroutine, as it ends).
func (w *sockWaiter) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	unix.Close(w.kick)
	w.kick = -1
}
