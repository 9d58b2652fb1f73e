package replicate

import (
	"encoding/binary"
	"errors"
	"sync"
	"time"
)

// Snapshot is a resync snapshot that the sender pulls records from while
// guests keep running (see the package doc). The node took it with its
// guests stopped only for a moment: it holds the state at log position At,
// and reads device memory out of a point-in-time copy as it is pulled.
type Snapshot interface {
	// At is the log position whose state the snapshot holds: the standby
	// applies the snapshot, then the records after At.
	At() uint64
	// Pause is how long guests were stopped to take it.
	Pause() time.Duration
	// Next returns the next record (Seq 0), or false after the last one.
	// A record of device memory is built in body (appended to it, as much
	// as its capacity holds), so the sender seals and sends it where it
	// lies; another record's Body may be the snapshot's own, valid until
	// the next call. An error ends the resync (the next attempt takes a
	// new snapshot). Next and Progress are called from one goroutine.
	Next(body []byte) (Record, bool, error)
	// Progress reports the contents bytes returned so far, of total.
	Progress() (done, total uint64)
	// Close releases what the snapshot holds.
	Close()
}

// ErrResyncBudget: while a resync streamed, a record larger than the whole
// resync budget was appended; the resync starts over.
var ErrResyncBudget = errors.New("the log outgrew its resync budget while the snapshot streamed")

// ResyncProgress describes a resync under way, for logs, /status and
// metrics. Bytes are snapshot contents (device memory).
type ResyncProgress struct {
	Active      bool    `json:"active"`
	BytesDone   uint64  `json:"bytes_done"`
	BytesTotal  uint64  `json:"bytes_total"`
	BytesPerSec float64 `json:"bytes_per_second"`
	Remaining   uint64  `json:"bytes_remaining"`
	ETASeconds  float64 `json:"eta_seconds"`
}

// ResyncTracker tracks one resync's bytes, for the sender and the
// standby's receiver; safe for concurrent use. The zero value is ready.
type ResyncTracker struct {
	mu      sync.Mutex
	active  bool
	start   time.Time
	done    uint64
	total   uint64
	lastLog time.Time
}

// Begin starts a resync of total contents bytes.
func (p *ResyncTracker) Begin(total uint64) {
	p.mu.Lock()
	now := time.Now()
	p.active, p.start, p.done, p.total, p.lastLog = true, now, 0, total, now
	p.mu.Unlock()
}

// End ends the resync.
func (p *ResyncTracker) End() {
	p.mu.Lock()
	p.active = false
	p.mu.Unlock()
}

// Add counts n more bytes and reports whether a progress line is due (one
// a second).
func (p *ResyncTracker) Add(n uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.setLocked(p.done + n)
}

// set is add for a known total done.
func (p *ResyncTracker) set(done uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.setLocked(done)
}

// Precondition: p.mu must be locked.
func (p *ResyncTracker) setLocked(done uint64) bool {
	p.done = done
	if now := time.Now(); now.Sub(p.lastLog) >= time.Second {
		p.lastLog = now
		return true
	}
	return false
}

// Status describes the resync.
func (p *ResyncTracker) Status() ResyncProgress {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := ResyncProgress{Active: p.active, BytesDone: min(p.done, p.total), BytesTotal: p.total}
	st.Remaining = st.BytesTotal - st.BytesDone
	if secs := time.Since(p.start).Seconds(); p.active && secs > 0 {
		st.BytesPerSec = float64(st.BytesDone) / secs
		if st.BytesPerSec > 0 {
			st.ETASeconds = float64(st.Remaining) / st.BytesPerSec
		}
	}
	return st
}

// LogArgs are a progress line's key/values.
func (st ResyncProgress) LogArgs() []any {
	return []any{"bytes", st.BytesDone, "total", st.BytesTotal, "remaining", st.Remaining,
		"rate_mb_s", int(st.BytesPerSec / 1e6), "eta", time.Duration(st.ETASeconds * float64(time.Second)).Round(time.Millisecond)}
}

// pacer bounds a resync's rate, so guests keep their share of the host
// and the link: it sleeps whenever the bytes sent run ahead of rate.
type pacer struct {
	rate  float64 // bytes per second; 0: unbounded
	start time.Time
	sent  float64
}

func newPacer(rate int64) *pacer { return &pacer{rate: float64(rate), start: time.Now()} }

func (p *pacer) wait(n int) {
	if p.rate <= 0 {
		return
	}
	p.sent += float64(n)
	ahead := time.Duration(p.sent/p.rate*float64(time.Second)) - time.Since(p.start)
	if ahead > time.Millisecond {
		time.Sleep(ahead)
	}
}

// resetBody is an OpReset record's body: the snapshot's contents bytes,
// so the standby can report its progress too.
func resetBody(total uint64) []byte { return binary.LittleEndian.AppendUint64(nil, total) }

// ResetTotal reads an OpReset record's body (resetBody): the snapshot's
// contents bytes, 0 when the body holds none.
func ResetTotal(body []byte) uint64 {
	if len(body) < 8 {
		return 0
	}
	return binary.LittleEndian.Uint64(body)
}
