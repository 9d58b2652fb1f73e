package guestconn

import (
	"sync"
	"time"
)

// Bounded memory per connection, before and after hello:
//   - before hello a connection may announce at most helloMaxPayload bytes
//     (a hello is a few hundred): a larger frame ends the connection; it
//     has small buffers and helloTimeout to say hello (conn.go);
//   - a frame's payload is read as it arrives (abi.FrameReader), so an
//     announced size costs nothing until its bytes come;
//   - the large buffers of all connections come from one budget
//     (Config.RequestBufferBytes): a frame that would exceed it waits
//     briefly, then is refused (StatusUnavailable, or at the next sync for
//     an async request) and skipped; the connection goes on;
//   - replies are bounded by what the guest reads: a connection holds at
//     most Config.ReplyQueueBytes of queued replies and one more, and
//     reads no request while it holds more (back-pressure); a guest that
//     reads nothing for Config.WriteTimeout loses its connection
//     (replies.go).

// helloMaxPayload bounds a frame from a connection that has not opened or
// resumed a session.
const helloMaxPayload = 4096

// budgetWait is how long a frame waits for budget before it is refused.
const budgetWait = time.Second

// Budget is abi.Budget for a node's guest connections.
type Budget struct {
	limit int64
	wait  time.Duration

	mu    sync.Mutex
	used  int64
	freed chan struct{} // closed (and replaced) whenever bytes are released
}

// NewBudget returns a budget of limit bytes; an Acquire waits up to wait for bytes.
func NewBudget(limit int64, wait time.Duration) *Budget {
	return &Budget{limit: limit, wait: wait, freed: make(chan struct{})}
}

// Acquire implements abi.Budget: it takes n bytes, waiting up to b.wait for
// other connections to release them.
func (b *Budget) Acquire(n int) bool {
	if int64(n) > b.limit {
		return false
	}
	var timeout <-chan time.Time
	for {
		b.mu.Lock()
		if b.used+int64(n) <= b.limit {
			b.used += int64(n)
			b.mu.Unlock()
			return true
		}
		freed := b.freed
		b.mu.Unlock()
		if timeout == nil {
			timeout = time.After(b.wait)
		}
		select {
		case <-freed:
		case <-timeout:
			return false
		}
	}
}

// Release implements abi.Budget.
func (b *Budget) Release(n int) {
	b.mu.Lock()
	b.used -= int64(n)
	close(b.freed)
	b.freed = make(chan struct{})
	b.mu.Unlock()
}

// Used is the bytes held now.
func (b *Budget) Used() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}
