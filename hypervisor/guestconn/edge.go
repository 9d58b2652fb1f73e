// Package guestconn is a hypervisor node's edge: one guest connection
// served from its first frame to its last (a session's, or a status
// connection's, which holds no session and only asks about the device:
// Status). One goroutine reads a
// connection's frames, runs them in order on its session and writes the
// replies, each once the node's commit rule lets it go (replies.go), with
// the connection's buffers drawn from the node's request budget
// (budget.go). Where a copy's bytes come from is decided here, as the
// frame arrives (Source): the frame itself, the shared ring a
// shared-memory guest left them in (Ring), or the host-memory region its
// connection maps (Host, hostmem.go).
//
// It owns framing, limits and buffers before and after hello, the reply
// order, what a connection holds for its guest (bounded by what the guest
// reads: back-pressure and a write deadline, budget.go), the host-memory
// region and shared area of a connection (taken, page-locked, let go),
// and what a connection counts and logs. It must
// never trust a frame (package abi checks framing; a frame that cannot be
// trusted ends its connection, a bad request fails that request only),
// never run a request itself (the session does, through Node and
// Session), and never let one connection's misbehaviour reach another's.
package guestconn

import (
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Node is the server the edge serves guests for.
type Node interface {
	// Hello opens a session for a new guest, or resumes one; a nil
	// Session with the reply and error when it does neither.
	Hello(payload []byte, p Peer) (Session, abi.Body, error)
	// Detach lets go of a session whose connection ended (kept for a
	// resume, or freed).
	Detach(s Session, log *slog.Logger)
	// SessionEnding notes that a session is being let go until done.
	SessionEnding() (done func())
	// ReplyGate is what a reply to op (which ended in err) waits for
	// under the node's commit rule, nil if it may go at once; false: it
	// must not be sent.
	ReplyGate(op abi.Opcode, err error) func() bool
	// LeaseExpired: the node may no longer answer guests.
	LeaseExpired() bool
	// Panicked turns a panic p recovered while serving one request of op
	// (s may be nil) into the request's reply and error.
	Panicked(s Session, op abi.Opcode, p any, log *slog.Logger) (abi.Body, error)
	// StatusHello opens a status connection (abi.OpStatusHello): nil with
	// the error when the node refuses it.
	StatusHello(payload []byte, p Peer) (Status, abi.Body, error)
}

// Status is a status connection as its connection drives it: it answers
// the requests about the device (abi.OpDeviceInfo, abi.OpDeviceStatus)
// and refuses every other; it holds no session.
type Status interface {
	Serve(op abi.Opcode, payload []byte) (abi.Body, error)
	// Close: the connection has ended.
	Close()
}

// Session is a guest's session as its connection drives it.
type Session interface {
	// Serve runs one request.
	Serve(Request) (abi.Body, error)
	ID() uint64
	Guest() string
	// Base is the guest's device-address window.
	Base() uint64
	// GPU is the index of the node's GPU the session runs on.
	GPU() int
	// Opened: the connection serves the session now, from guest process
	// peerPID (0: unknown) with its host-memory region (nil: none).
	Opened(peerPID int, host *Region)
	// EndGrace: the session is not kept for a resume once its connection
	// ends (the guest said bye, or never learned of it).
	EndGrace()
	// DeferError keeps the error of asynchronous request reqID (op), which
	// the connection refused without reading it, for the guest's next
	// synchronization; the session answers the request with it.
	DeferError(op abi.Opcode, reqID uint64, err error)
	// DropRegion makes sure the session no longer uses region, waiting
	// for its device copies from it (an error: they failed).
	DropRegion(region *Region) error
	// Idle: the guest has sent nothing more for now; work the session
	// holds back to batch goes on to the GPU.
	Idle()
}

// Peer is who sent a hello: the ABI version it speaks, the tenant the
// transport vouches for, and the connection's log.
type Peer struct {
	Version uint16
	Tenant  string
	Log     *slog.Logger
}

// Request is one session request as its connection hands it over: the
// guest's op, id and payload, and, where a copy's bytes are not in the
// frame, their source.
type Request struct {
	Op      abi.Opcode
	ID      uint64
	Async   bool
	Payload []byte // the body, or a ring copy's fixed fields
	Src     Source // nil: the payload holds everything
	// Sum is the payload's CRC32C where Summed says the frame reader
	// computed it on the way in (a large frame's: abi.Frame.PayloadSum).
	Sum    uint32
	Summed bool
}

// Source is where a host-to-device copy's bytes lie when the frame does
// not hold them: Ring or Host. The session reads them once, or lets the
// device take them where they lie.
type Source interface{ source() }

// Ring is a copy's data left in the shared ring (a shared-memory guest's
// large copy_htod: its fixed fields are the request's payload).
type Ring struct{ Data *abi.InPlace }

// Host is a copy_htod_hostmem's data in the connection's host-memory
// region, at the offset and length its request names.
type Host struct{ Region *Region }

func (Ring) source() {}
func (Host) source() {}

// Config is what an edge is given.
type Config struct {
	// MaxPayload bounds a frame's payload after hello; RequestBufferBytes
	// is the budget of all connections' buffered request bytes.
	MaxPayload         int
	RequestBufferBytes int64
	// ReplyQueueBytes bounds the reply bytes one connection holds queued:
	// past it the connection reads none of its guest's requests until
	// replies went out (replies.go; zero: none while a reply is queued).
	// WriteTimeout is how long a write of
	// at most writeChunk reply bytes may wait for the guest to read (zero:
	// forever); a guest that reads nothing for that long loses its
	// connection, and its session is kept for its grace period.
	ReplyQueueBytes int64
	WriteTimeout    time.Duration
	// Backend page-locks a connection's shared memory where it can
	// (gpu.HostRegistrar); it runs nothing.
	Backend gpu.Backend
}

// Edge serves a node's guest connections.
type Edge struct {
	cfg     Config
	node    Node
	budget  *Budget
	metrics *Metrics
	log     *slog.Logger
	// queued is the reply bytes all connections hold queued now.
	queued atomic.Int64
}

// New returns the edge of node. Its metrics' collectors are the caller's
// to register.
func New(node Node, cfg Config, metrics *Metrics, log *slog.Logger) *Edge {
	return &Edge{cfg: cfg, node: node, budget: NewBudget(cfg.RequestBufferBytes, budgetWait), metrics: metrics, log: log}
}

// Budget is the request-buffer budget all the edge's connections share.
func (e *Edge) Budget() *Budget { return e.budget }

// QueuedReplyBytes is the reply bytes all connections hold queued for
// their guests now (each at most Config.ReplyQueueBytes and one reply).
func (e *Edge) QueuedReplyBytes() int64 { return e.queued.Load() }

// Metrics are what an edge counts.
type Metrics struct {
	Requests    *prometheus.CounterVec // by op and status
	FrameErrors *prometheus.CounterVec // by reason
	Refusals    *prometheus.CounterVec // by reason
	// WriteTimeouts counts connections ended because their guest read
	// none of its replies for Config.WriteTimeout.
	WriteTimeouts prometheus.Counter
	// RequestBytes counts the bytes of guests' request frames, headers
	// and payloads, a copy's data however it arrived (nil: not counted).
	RequestBytes prometheus.Counter
	// Latency by opcode, made once: a request finds its child by index,
	// not by hashing label values.
	Latency []prometheus.Observer
}

// OKCounters holds one connection's counters of requests answered "ok",
// by opcode, each made on its op's first success (a series appears once
// it counts something): the connection finds its counter by index, not
// by hashing label values per request. One goroutine uses it.
type OKCounters []prometheus.Counter

// countRequest counts one request of op answered with st.
func (m *Metrics) countRequest(ok *OKCounters, op abi.Opcode, st abi.Status) {
	if st != abi.StatusOK || int(op) >= len(m.Latency) {
		m.Requests.WithLabelValues(op.String(), st.String()).Inc()
		return
	}
	if *ok == nil {
		*ok = make(OKCounters, len(m.Latency))
	}
	if (*ok)[op] == nil {
		(*ok)[op] = m.Requests.WithLabelValues(op.String(), st.String())
	}
	(*ok)[op].Inc()
}

// observeLatency records how long a request of op took since start.
func (m *Metrics) observeLatency(op abi.Opcode, start time.Time) {
	if int(op) < len(m.Latency) && m.Latency[op] != nil {
		m.Latency[op].Observe(time.Since(start).Seconds())
	}
}
