// Package pvdriver is the guest side of vgpuha: a paravirtual GPU driver with
// a typed Go API (memory, copies, modules, launches, streams) whose calls
// travel to the hypervisor over vsock, a unix socket, TCP or, for a guest
// on the hypervisor's own host, shared memory (shm+unix://; see
// pvdriver/transport).
//
// Calls that return data or a handle wait for their reply. Launches and the
// *Async copies are pipelined: they are queued and sent without waiting, and
// an error they cause is reported by the next StreamSynchronize or
// Synchronize, as CUDA reports asynchronous errors. A Client is safe for use
// by several goroutines; requests reach the hypervisor in the order their
// calls were made.
//
// MapAperture maps device memory into the guest for direct writes (over a
// unix socket or shared memory: the memory is a file shared with the hypervisor, which traces
// the writes; see aperture.go). Apertures need Linux; elsewhere the rest of
// the driver works and MapAperture returns ErrAperturesUnsupported.
package pvdriver

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/pvdriver/transport"
	"github.com/vgpuha/vgpuha/pvdriver/transport/shm"
)

// Handle types a guest holds. They are virtual: they stay valid however the
// hypervisor's own handles change (failover included).
type (
	// DevicePtr is a device virtual address.
	DevicePtr uint64
	Module    uint64
	Function  uint64
	// Stream zero is the null stream.
	Stream uint64
)

// Errors a call can return, for use with errors.Is. Each *Error unwraps to
// one of them.
var (
	ErrInvalidValue  error = abi.StatusInvalidValue
	ErrInvalidHandle error = abi.StatusInvalidHandle
	ErrOutOfRange    error = abi.StatusOutOfRange
	ErrOutOfMemory   error = abi.StatusOutOfMemory
	ErrNotSupported  error = abi.StatusNotSupported
	ErrLaunchFailed  error = abi.StatusLaunchFailed
	ErrBadFrame      error = abi.StatusBadFrame
	// ErrClosed reports a call on a client whose connection has ended.
	ErrClosed = errors.New("pvdriver: connection closed")
	// ErrRolledBack reports a failover to a node that lacks state changes
	// the guest had already been told were done (async mode, or a primary
	// that had lost its standby): the session cannot continue as if nothing
	// happened; the guest must restart from its own last checkpoint.
	ErrRolledBack = errors.New("pvdriver: resumed session was rolled back")
	// ErrSessionLost reports a session no node holds any more: every
	// endpoint answered, each deposed or serving without it (it was opened
	// on a primary that had been deposed, so its standby never got it).
	// Every call fails at once; open a new session.
	ErrSessionLost = errors.New("pvdriver: the session is lost")
)

// Error is a request the hypervisor refused.
type Error struct {
	Op      abi.Opcode
	Status  abi.Status
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("pvdriver: %s: %s", e.Op, e.Message) }
func (e *Error) Unwrap() error { return e.Status }

// Options configure a client.
type Options struct {
	// GuestName identifies the guest in the hypervisor's logs and status.
	GuestName string
	// MaxPayload bounds a frame; larger copies are split. Zero means
	// abi.DefaultMaxPayload, which the hypervisor accepts by default.
	MaxPayload int
	// Failover lists further endpoints (the standby's) to resume the
	// session on when the connection is lost. Empty: no failover, a lost
	// connection fails every call.
	Failover []string
	// ResumeTimeout bounds the search for a node to resume on (default 30s).
	ResumeTimeout time.Duration
	// ResumeSession, when set, takes over an existing session (one whose
	// guest restarted, e.g. a VM restored from its checkpoint) instead of
	// opening a new one. ResumeToken must then hold the session's resume
	// token (Client.ResumeToken, saved with the checkpoint).
	ResumeSession uint64
	ResumeToken   []byte
	// HashImagesFrom is the size from which a module image is named by its
	// hash before its bytes are sent (LoadModule); 0 means 16 KiB.
	HashImagesFrom int
	// GPU pins a new session to one of the node's GPUs, by index or UUID
	// (empty: the node places it by its policy). A node that does not
	// serve it refuses the session.
	GPU string
}

// Client is an open session with the hypervisor.
//
// With Failover set, the client keeps every request it has sent since the
// last commit point (a reply the hypervisor only sends once the standby has
// applied everything before it; see abi.OpInfo.Commits). When the
// connection breaks, or a call stalls on one that stays open (a frozen
// node), it resumes the session on the endpoint that takes it under the
// newest term (failover.go), resends the kept requests with their original ids, and the node
// answers the ones it already applied from its state: each request takes
// effect exactly once, and calls in flight simply complete.
type Client struct {
	stats      opCounters // requests sent and waited for, per opcode (opstats.go)
	maxPayload int
	opts       Options
	endpoints  []string
	sendq      chan *outFrame // frames, each with a reference for the writer (frames.go)
	frames     framePool
	done       chan struct{}
	nextID     atomic.Uint64
	resumed    chan *bufio.Writer // a new connection, for the writer
	bye        chan byeFrame      // the last frame, from Close

	// orderMu is held from taking a request's id to its place in the
	// stream (submit).
	orderMu sync.Mutex
	// The write path (frames.go): whoever writes to bw holds wmu. bw is
	// the connection's writer (nil while it is down), wgen its
	// generation, wring whether it is a ring (shared memory); queued
	// counts frames in sendq not yet written.
	wmu sync.Mutex
	bw  *bufio.Writer
	// writingSince is when the write in progress began (Unix ns; 0: none):
	// a frozen node stops reading, and a guest that only pipelines
	// requests then waits on this write, not on a reply (stalled).
	writingSince atomic.Int64
	wgen         uint64
	wring        bool
	queued       atomic.Int64

	mu      sync.Mutex
	conn    net.Conn
	gen     uint64 // connection generation
	serving string // the endpoint conn goes to; empty while a lost one is resumed (failover only)
	term    uint64 // the term of the node that serves the session (failover.go)
	pending map[uint64]chan result
	// into holds where a call's data reply goes, by its channel
	// (expectInto): the reader copies it there from the frame it read,
	// instead of handing the caller a copy of the whole reply (for a 3 MiB
	// read, one copy where there were two and an allocation).
	into    map[chan result][]byte
	rd      *replyReader         // the connection's reply reader (replies.go)
	waiting map[uint64]time.Time // when each pending call was made (failover only)
	kept    []keptFrame          // sent since the last commit point, in order
	// forgotten is the newest state-changing request dropped from kept at
	// a commit point: the guest relies on it, and will not resend it.
	forgotten uint64
	// rolledBack is set when a resume found the session behind forgotten;
	// rolledBackTo is the last request the session still holds.
	rolledBack   error
	rolledBackTo uint64
	abandoned    map[uint64]bool // calls failed by a rollback; their late replies are dropped
	err          error           // why the client ended
	// opened: the hello was answered, so there is a session to resume
	// after a lost connection; closing: Close is ending it, so there is
	// none to resume any more.
	opened, closing bool
	failures        []Failover

	session            uint64
	token              []byte // the session's resume token: a secret
	windowBase, window uint64
	closeOnce          sync.Once
	apertures          []*Aperture // mapped apertures, re-attached after a failover
	host               *hostArena  // the host-memory region (hostmem.go); nil for none
}

// keptFrame is a request kept for resending after a failover.
type keptFrame struct {
	id    uint64
	op    abi.Opcode
	frame *outFrame // the kept list holds a reference
	sent  bool      // handed to the writer (so it may have reached the old node)
	sync  bool      // a call waiting for its reply (not a pipelined request)
}

type result struct {
	payload []byte
	err     error
	// placed: a data reply's bytes are already where the caller asked
	// (expectInto); payload is nil.
	placed bool
}

// Open connects to the hypervisor at endpoint and opens a session. With
// opts.Failover, the first connection also tries those endpoints in order
// (after a takeover, the promoted standby is the one that serves); the
// session then fails over along the same list.
func Open(ctx context.Context, endpoint string, opts Options) (*Client, error) {
	host, err := transport.NewHostMemory(endpoint)
	if err != nil {
		return nil, fmt.Errorf("pvdriver: host memory for %s: %w", endpoint, err)
	}
	c, err := open(ctx, endpoint, opts, host)
	if err != nil && host != nil {
		host.Close()
	}
	return c, err
}

// open opens a session on the first endpoint that serves one. With
// failover endpoints, a round in which every endpoint was down, lost the
// connection before its hello was answered, or said it does not serve now
// (a node being promoted or fenced) is tried again, a round every
// probeEvery, until ctx ends or ResumeTimeout: a guest started during a
// takeover gets its session on the new primary.
func open(ctx context.Context, endpoint string, opts Options, host *shm.HostMemory) (*Client, error) {
	endpoints := append([]string{endpoint}, opts.Failover...)
	start := time.Now()
	for {
		c, failed, transient, err := openRound(ctx, endpoints, opts, host)
		if c != nil || len(endpoints) == 1 {
			return c, err
		}
		looking := time.Since(start)
		if !transient || ctx.Err() != nil || looking >= resumeTimeout(opts) {
			return nil, fmt.Errorf("pvdriver: no endpoint serves guests (%s)", strings.Join(failed, "; "))
		}
		select {
		case <-time.After(probeEvery(looking)):
		case <-ctx.Done():
		}
	}
}

// openRound tries each endpoint once, in order. It returns the client of
// the first that opened a session, or what each said and whether every
// failure may pass (see open); err is the one endpoint's error when there
// is only one.
func openRound(ctx context.Context, endpoints []string, opts Options, host *shm.HostMemory) (c *Client, failed []string, transient bool, err error) {
	transient = true
	for i, ep := range endpoints {
		conn, err := transport.DialWith(ctx, ep, host)
		if err != nil {
			failed = append(failed, fmt.Sprintf("connecting to %s: %v", ep, err))
			if len(endpoints) == 1 {
				return nil, nil, false, fmt.Errorf("pvdriver: connecting to %s: %w", ep, err)
			}
			continue
		}
		// The endpoint that served comes first; the others stay, in order,
		// as places to resume.
		order := append(append([]string{ep}, endpoints[i+1:]...), endpoints[:i]...)
		c, err := newClient(conn, order, opts, host)
		if err != nil {
			conn.Close()
			failed = append(failed, fmt.Sprintf("opening a session on %s: %v", ep, err))
			if len(endpoints) == 1 || ctx.Err() != nil {
				return nil, failed, false, err // the search is over: failed says why
			}
			transient = transient && (errors.Is(err, ErrClosed) || errors.Is(err, abi.StatusUnavailable))
			continue
		}
		return c, nil, false, nil
	}
	return nil, failed, transient, nil
}

// resumeTimeout is opts.ResumeTimeout or its default.
func resumeTimeout(opts Options) time.Duration {
	if opts.ResumeTimeout == 0 {
		return defaultResumeTimeout
	}
	return opts.ResumeTimeout
}

// defaultResumeTimeout is Options.ResumeTimeout's default.
const defaultResumeTimeout = 30 * time.Second

// NewClient opens a session over an established connection (no failover).
func NewClient(conn net.Conn, opts Options) (*Client, error) {
	opts.Failover = nil
	return newClient(conn, nil, opts, nil)
}

func newClient(conn net.Conn, endpoints []string, opts Options, host *shm.HostMemory) (*Client, error) {
	if opts.MaxPayload == 0 {
		opts.MaxPayload = abi.DefaultMaxPayload
	}
	opts.ResumeTimeout = resumeTimeout(opts)
	c := &Client{
		conn:       conn,
		opts:       opts,
		endpoints:  endpoints,
		maxPayload: opts.MaxPayload,
		sendq:      make(chan *outFrame, 1024),
		done:       make(chan struct{}),
		resumed:    make(chan *bufio.Writer),
		bye:        make(chan byeFrame),
		pending:    map[uint64]chan result{},
		waiting:    map[uint64]time.Time{},
		abandoned:  map[uint64]bool{},
		into:       map[chan result][]byte{},
		host:       newHostArena(host),
	}
	if len(endpoints) > 0 {
		c.serving = endpoints[0]
	}
	_, c.wring = conn.(ringConn)
	c.bw = bufio.NewWriterSize(conn, 256<<10)
	go c.writeLoop()
	if c.failover() {
		go c.watchdog()
	}
	go c.readLoop(conn, 0)
	var hr abi.HelloReply
	hello := &abi.Hello{GuestName: opts.GuestName, Resume: opts.ResumeSession, GraceMS: c.graceMS()}
	if opts.ResumeSession != 0 {
		hello.Token = opts.ResumeToken
	} else {
		hello.GPU = opts.GPU
	}
	var unanswered *time.Timer
	wait := helloWait(opts.ResumeSession != 0)
	if c.failover() {
		// A node that does not answer the hello (frozen, or deposed and
		// holding the reply) is left for the next endpoint (open).
		unanswered = time.AfterFunc(wait, func() { c.lost(0, fmt.Errorf("no answer to hello within %v", wait)) })
	}
	err := c.call(abi.OpHello, hello, &hr)
	if unanswered != nil && !unanswered.Stop() && err == nil {
		err = fmt.Errorf("%w: no answer to hello within %v", ErrClosed, wait) // answered as the client gave up
	}
	if err != nil {
		c.host = nil // the caller closes it
		c.Close()
		return nil, err
	}
	c.session, c.windowBase, c.window, c.token = hr.Session, hr.WindowBase, hr.WindowSize, hr.Token
	c.mu.Lock()
	c.term, c.opened = hr.Term, true
	c.mu.Unlock()
	if opts.ResumeSession != 0 {
		// A restarted guest numbers on from what the session applied, or
		// its first requests would be taken for resends.
		c.token = append([]byte(nil), opts.ResumeToken...)
		if n := c.nextID.Load(); hr.Applied > n {
			c.nextID.Store(hr.Applied)
		}
	}
	return c, nil
}

func (c *Client) failover() bool { return len(c.opts.Failover) > 0 }

// helloWait bounds how long a failover client waits for a node to answer
// its hello. A resume needs no GPU work: 3 s, longer than a node waits for
// a slot a session is giving back (2 s). A new session needs a GPU
// context, made in a worker process of its own where the guest brings
// kernels, and in commit mode its standby's too, in the order of its
// log: with many guests starting at once on a busy GPU that takes
// seconds, so 30 s. The bound only matters for a node that never
// answers (frozen, or deposed and holding the reply).
func helloWait(resume bool) time.Duration {
	if resume {
		return 3 * time.Second
	}
	return 30 * time.Second
}

// graceMS asks nodes to keep the session while this client looks for a
// way back (failover clients only).
func (c *Client) graceMS() uint32 {
	if !c.failover() {
		return 0
	}
	return uint32(c.opts.ResumeTimeout.Milliseconds())
}

// Session is the hypervisor's id for this session.
func (c *Client) Session() uint64 { return c.session }

// ResumeToken is the secret that resumes this session (Options.ResumeToken).
// Whoever holds it can take the session over: keep it like a key, out of
// logs.
func (c *Client) ResumeToken() []byte { return append([]byte(nil), c.token...) }

// Window is the session's device-address window.
func (c *Client) Window() (base, size uint64) { return c.windowBase, c.window }

// Failovers lists the resumes this client went through.
func (c *Client) Failovers() []Failover {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Failover(nil), c.failures...)
}

// AcceptRollback lets the client go on after ErrRolledBack, on the session
// as the new primary holds it (the guest must itself go back to the matching
// point, e.g. the VM checkpoint of the last committed epoch). It returns the
// last request the session holds.
func (c *Client) AcceptRollback() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rolledBack, c.forgotten = nil, c.rolledBackTo
	return c.rolledBackTo
}

// Close ends the session; the hypervisor frees everything it held at once
// (it does not keep it for a resume). Close waits, up to byeWait, until
// the hypervisor says it has freed the session, so that the session's slot
// is free by the time the guest's process exits (a program started right
// after this one gets it). A lost connection is not resumed once Close
// has begun.
func (c *Client) Close() error {
	if c.beginClose() {
		c.sayBye()
	}
	c.shutdown(ErrClosed)
	c.host.close()
	return nil
}

// byeWait bounds how long Close waits for the hypervisor to free the
// session.
const byeWait = 2 * time.Second

// beginClose marks the client closing and reports whether it has a
// session to say bye to.
func (c *Client) beginClose() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	had := c.opened && !c.closing && c.err == nil
	c.closing = true
	return had
}

// sayBye sends the bye after everything queued, as a call, and waits for
// its answer, the connection's end (a hypervisor that answers no bye
// closes it), or byeWait. The bye is never kept for a resend: a session
// that is closing is not resumed.
func (c *Client) sayBye() {
	id := c.nextID.Add(1)
	answered := make(chan result, 1)
	c.mu.Lock()
	if c.pending == nil {
		c.mu.Unlock()
		return
	}
	c.pending[id] = answered
	rr := c.rd
	c.mu.Unlock()
	if rr != nil {
		rr.wake() // the reader goroutine reads for it
	}
	timeout := time.NewTimer(byeWait)
	defer timeout.Stop()
	bye := abi.AppendBodyFrame(nil, abi.OpBye, 0, id, &abi.Bye{})
	select {
	case c.bye <- byeFrame{frame: bye, done: make(chan struct{})}:
	case <-c.done:
		return
	case <-timeout.C:
		return
	}
	select {
	case <-answered:
	case <-c.done:
	case <-timeout.C:
	}
}

type byeFrame struct {
	frame []byte
	done  chan struct{}
}

func (c *Client) shutdown(why error) {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.err = why
		pending := c.pending
		c.pending = nil
		conn := c.conn
		c.wakeReaderLocked()
		c.mu.Unlock()
		close(c.done)
		conn.Close()
		for _, ch := range pending {
			ch <- result{err: why}
		}
	})
}

func (c *Client) closedErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// writeLoop is the goroutine that writes queued frames, across
// connections: it flushes whenever the queue runs dry, so a burst of
// pipelined calls goes out in few writes; after a resume it first resends
// the kept frames. held is a frame taken from the queue just as the
// connection went down: it goes out after the resend.
func (c *Client) writeLoop() {
	var held *outFrame
	for {
		c.wmu.Lock()
		up := c.bw != nil
		c.wmu.Unlock()
		queue := c.sendq
		if !up || held != nil {
			queue = nil // connection lost: wait for the resume
		}
		select {
		case <-c.done:
			return
		case nw := <-c.resumed:
			c.wmu.Lock()
			if c.useResumed(nw) && held != nil {
				held.release() // queued before a rollback: it must not run (switchTo)
				c.queued.Add(-1)
				held = nil
			}
			if held != nil && c.bw != nil {
				c.writeFrame(held, true)
				c.queued.Add(-1)
				held = nil
			}
			c.wmu.Unlock()
		case b := <-byeQueue(c, up):
			c.wmu.Lock()
			// Everything queued before Close goes first, then the bye.
			for c.bw != nil && len(c.sendq) > 0 {
				c.writeFrame(<-c.sendq, false)
				c.queued.Add(-1)
			}
			if c.bw != nil {
				c.bw.Write(b.frame)
				c.bw.Flush()
			}
			c.wmu.Unlock()
			close(b.done)
		case f := <-queue:
			c.wmu.Lock()
			if c.bw == nil {
				held = f // a caller's write just lost the connection
			} else {
				c.writeFrame(f, len(c.sendq) == 0)
				c.queued.Add(-1)
			}
			c.wmu.Unlock()
		}
	}
}

// useResumed makes nw, a resumed connection's writer, the one frames go to,
// and resends the kept frames on it. It reports whether the session was
// rolled back. wmu must be held.
func (c *Client) useResumed(nw *bufio.Writer) (rolledBack bool) {
	c.bw = nw
	c.mu.Lock()
	c.wgen = c.gen
	_, c.wring = c.conn.(ringConn)
	rolledBack = c.rolledBack != nil
	var resend []*outFrame
	for _, k := range c.kept {
		if k.sent {
			k.frame.hold() // the writer's, while it resends it
			resend = append(resend, k.frame)
			if _, waiting := c.pending[k.id]; k.sync && !waiting {
				// Answered before the failover: the new node answers
				// it again (from its state), and nobody waits for that.
				c.abandoned[k.id] = true
			}
		}
	}
	c.mu.Unlock()
	for _, f := range resend {
		c.bw.Write(f.b)
		f.release()
	}
	if err := c.bw.Flush(); err != nil {
		c.lost(c.wgen, err)
		c.bw = nil
	}
	return rolledBack
}

// byeQueue is the bye channel while a connection is up, else nil.
func byeQueue(c *Client, up bool) chan byeFrame {
	if !up {
		return nil
	}
	return c.bye
}

// markSent notes that f is being written (a kept frame is resent after a
// failover from then on).
func (c *Client) markSent(f *outFrame) {
	if !c.failover() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.kept) - 1; i >= 0; i-- {
		if c.kept[i].frame == f {
			c.kept[i].sent = true
			return
		}
	}
}

// committedLocked forgets kept frames up to id: a commit-point reply to id
// means the standby holds all of them. A refused request (failed) changed
// nothing, so the guest does not rely on it.
// Precondition: c.mu must be locked.
func (c *Client) committedLocked(id uint64, failed bool) {
	n := 0
	for n < len(c.kept) && c.kept[n].id <= id && c.kept[n].sent {
		if c.kept[n].op.Info().Mutates && !(failed && c.kept[n].id == id) {
			c.forgotten = max(c.forgotten, c.kept[n].id)
		}
		c.kept[n].frame.release()
		n++
	}
	c.kept = c.kept[n:]
}

// answeredBefore reports whether id is a synchronous request kept for a
// resend whose reply the caller already had: a node that took the session
// over answers the resend again (from its state), and that second reply
// has nobody waiting for it.
func (c *Client) answeredBefore(id uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := sort.Search(len(c.kept), func(i int) bool { return c.kept[i].id >= id })
	if i == len(c.kept) || c.kept[i].id != id {
		return false
	}
	f := c.kept[i].frame.b
	return len(f) >= abi.HeaderSize && binary.LittleEndian.Uint16(f[8:])&abi.FlagAsync == 0
}

// send hands a frame and the caller's reference to it to the writer
// (keeping it for a resend, with a reference of its own, when failover is
// on). The caller must not touch the frame afterwards. A frame sent with
// flush unset may wait in the writer's buffer until flushHeld.
func (c *Client) send(id uint64, op abi.Opcode, frame *outFrame, sync, flush bool) error {
	if c.failover() {
		c.mu.Lock()
		if err := c.rolledBack; err != nil {
			delete(c.pending, id)
			delete(c.waiting, id)
			c.mu.Unlock()
			frame.release()
			return err
		}
		frame.hold()
		c.kept = append(c.kept, keptFrame{id: id, op: op, frame: frame, sync: sync})
		c.mu.Unlock()
	}
	if c.writeDirect(frame, sync, flush) {
		return nil
	}
	c.queued.Add(1)
	select {
	case c.sendq <- frame:
		return nil
	case <-c.done:
		// Nobody writes it now; a kept reference stays with the kept list.
		c.queued.Add(-1)
		frame.release()
		return c.closedErr()
	}
}

// frame encodes a request into a pooled buffer; sizeHint is the body's
// size where known (a bulk copy's), so the buffer need not grow.
func (c *Client) frame(op abi.Opcode, flags uint16, req abi.Body, sizeHint int) (uint64, *outFrame) {
	id := c.nextID.Add(1)
	f := &outFrame{pool: &c.frames, b: c.frames.get(abi.HeaderSize + sizeHint)}
	f.refs.Store(1)
	f.b = abi.AppendBodyFrame(f.b, op, flags, id, req)
	return id, f
}

// copyHeader bounds the encoding of a copy request without its data.
const copyHeader = 64

// call sends a request and waits for its reply, decoding the body into
// reply (nil for none).
func (c *Client) call(op abi.Opcode, req, reply abi.Body) error {
	return c.callSized(op, req, reply, 0)
}

// callSized is call with the request body's size where known.
func (c *Client) callSized(op abi.Opcode, req, reply abi.Body, sizeHint int) error {
	ch := make(chan result, 1)
	rr, drive, err := c.submit(op, req, sizeHint, ch)
	if err != nil {
		return err
	}
	return c.finish(op, reply, rr, drive, ch)
}

// finish waits for a submitted call's reply and decodes it into reply.
func (c *Client) finish(op abi.Opcode, reply abi.Body, rr *replyReader, drive bool, ch chan result) error {
	_, err := c.finishPlaced(op, reply, rr, drive, ch)
	return err
}

// finishPlaced is finish, also reporting whether a data reply's bytes were
// placed where the caller asked (expectInto), reply left as it was.
func (c *Client) finishPlaced(op abi.Opcode, reply abi.Body, rr *replyReader, drive bool, ch chan result) (placed bool, err error) {
	start := time.Now()
	r := c.awaitReply(rr, drive, ch)
	c.stats.noteWaited(op, time.Since(start))
	if r.err != nil || r.placed {
		return r.placed, r.err
	}
	return false, c.decodeReply(op, r.payload, reply)
}

// expectInto asks for ch's data reply to be placed in dst; forgetInto
// withdraws that (once the call is over, however it ended).
func (c *Client) expectInto(ch chan result, dst []byte) {
	c.mu.Lock()
	c.into[ch] = dst
	c.mu.Unlock()
}

func (c *Client) forgetInto(ch chan result) {
	c.mu.Lock()
	delete(c.into, ch)
	c.mu.Unlock()
}

// decodeReply decodes a reply's payload into reply, turning a status
// other than OK into an *Error.
func (c *Client) decodeReply(op abi.Opcode, payload []byte, reply abi.Body) error {
	st, msg, err := abi.DecodeReply(payload, reply)
	if err != nil {
		return fmt.Errorf("pvdriver: decoding %s reply: %w", op, err)
	}
	if st != abi.StatusOK {
		return &Error{Op: op, Status: st, Message: msg}
	}
	return nil
}

// post sends a pipelined request without waiting.
func (c *Client) post(op abi.Opcode, req abi.Body) error {
	return c.postSized(op, req, 0)
}

// postSized is post with the request body's size where known.
func (c *Client) postSized(op abi.Opcode, req abi.Body, sizeHint int) error {
	_, _, err := c.submit(op, req, sizeHint, nil)
	return err
}

// submit encodes a request under the next id and sends it: a call (ch
// set, for its reply, registered first) or a pipelined request. The id is
// taken and the frame put in its place in the stream in one step, under
// orderMu: the node takes a request whose id is not above the newest it
// applied for a resend, answering it from its state without running it,
// so no frame may overtake one with a lower id (goroutines calling at
// once).
func (c *Client) submit(op abi.Opcode, req abi.Body, sizeHint int, ch chan result) (rr *replyReader, drive bool, err error) {
	return c.submitFlushed(op, req, sizeHint, ch, true)
}

// submitFlushed is submit, its frame flushed at once only if flush is set
// (else it may wait in the writer's buffer until flushHeld).
func (c *Client) submitFlushed(op abi.Opcode, req abi.Body, sizeHint int, ch chan result, flush bool) (rr *replyReader, drive bool, err error) {
	flags := uint16(abi.FlagAsync)
	if ch != nil {
		flags = 0
	}
	c.orderMu.Lock()
	defer c.orderMu.Unlock()
	id, frame := c.frame(op, flags, req, sizeHint)
	if ch != nil {
		if rr, drive, err = c.register(id, ch); err != nil {
			frame.release()
			return nil, false, err
		}
	}
	if err := c.send(id, op, frame, ch != nil, flush); err != nil {
		if drive {
			c.releaseTurn(rr)
		}
		return nil, false, err
	}
	c.stats.noteSent(op)
	return rr, drive, nil
}

// chunk is the largest copy one frame carries: whole pages where it can
// be (a large copy's pieces stay page-aligned on the device), and small
// enough that the frame, header and all, fits within the payload limit,
// so that a full frame takes a buffer of the limit's size class (16 MiB
// by default), not one twice that.
func (c *Client) chunk() int {
	n := c.maxPayload - copyHeader - abi.HeaderSize
	if pages := n &^ (4096 - 1); pages > 0 {
		return pages
	}
	return max(n, 1)
}

// Alloc allocates size bytes of device memory.
func (c *Client) Alloc(size uint64) (DevicePtr, error) {
	var r abi.AllocReply
	err := c.call(abi.OpAlloc, &abi.Alloc{Size: size}, &r)
	return DevicePtr(r.Ptr), err
}

// Free frees an allocation made by Alloc.
func (c *Client) Free(p DevicePtr) error { return c.call(abi.OpFree, &abi.Free{Ptr: uint64(p)}, nil) }

// CopyHtoD copies src to device memory at dst and waits for it.
func (c *Client) CopyHtoD(dst DevicePtr, src []byte) error {
	return c.copyHtoD(dst, src, 0, false)
}

// CopyHtoDAsync queues a copy of src to dst on stream s. src is copied
// before the call returns, so the caller may reuse it, unless it lies in
// the host-memory region (AllocHost): then, as with CUDA's page-locked
// memory, the device may read it until s is synchronised.
func (c *Client) CopyHtoDAsync(dst DevicePtr, src []byte, s Stream) error {
	return c.copyHtoD(dst, src, s, true)
}

func (c *Client) copyHtoD(dst DevicePtr, src []byte, s Stream, async bool) error {
	if done, err := c.copyHtoDHost(dst, src, s, async); done {
		return err
	}
	return c.copyHtoDFrames(dst, src, s, async)
}

// copyHtoDFrames sends src inline, in frames of at most chunk bytes: a
// pipelined copy posts them, a synchronous one has up to pieceWindow of
// them in flight as calls (inlineWindow).
func (c *Client) copyHtoDFrames(dst DevicePtr, src []byte, s Stream, async bool) error {
	piece := func(k, n int) *abi.CopyHtoD {
		return &abi.CopyHtoD{Dst: uint64(dst) + uint64(k), Stream: uint64(s), Data: src[k : k+n]}
	}
	if len(src) == 0 {
		if async {
			return c.postSized(abi.OpCopyHtoD, piece(0, 0), copyHeader)
		}
		return c.callSized(abi.OpCopyHtoD, piece(0, 0), nil, copyHeader)
	}
	if !async {
		return c.callPieces(abi.OpCopyHtoD, len(src), inlineWindow, func(k, n int, ch chan result) (*replyReader, bool, error) {
			return c.submit(abi.OpCopyHtoD, piece(k, n), copyHeader+n, ch)
		}, nil)
	}
	for k := 0; k < len(src); k += c.chunk() {
		n := min(c.chunk(), len(src)-k)
		if err := c.postSized(abi.OpCopyHtoD, piece(k, n), copyHeader+n); err != nil {
			return err
		}
	}
	return nil
}

// CopyDtoH copies device memory at src into dst and waits for it. It orders
// after all earlier work on the null stream.
func (c *Client) CopyDtoH(dst []byte, src DevicePtr) error {
	if done, err := c.copyDtoHHost(dst, src); done {
		return err
	}
	return c.copyDtoHFrames(dst, src)
}

// copyDtoHFrames copies into dst through replies of at most chunk bytes.
func (c *Client) copyDtoHFrames(dst []byte, src DevicePtr) error {
	n := c.chunk()
	for off := 0; off < len(dst) || off == 0; off += n {
		end := min(off+n, len(dst))
		f := &inFlight{op: abi.OpCopyDtoH, read: &Read{Dst: dst[off:end], Src: src + DevicePtr(off)}}
		if err := c.sendCall(f, &abi.CopyDtoH{Src: uint64(f.read.Src), Size: uint64(end - off)}, true); err != nil {
			return err
		}
		if err := c.awaitCall(f); err != nil {
			return err
		}
		if end == len(dst) {
			break
		}
	}
	return nil
}

// CopyDtoD copies n bytes between device addresses and waits for it.
func (c *Client) CopyDtoD(dst, src DevicePtr, n uint64) error {
	return c.call(abi.OpCopyDtoD, &abi.CopyDtoD{Dst: uint64(dst), Src: uint64(src), Size: n}, nil)
}

// CopyDtoDAsync queues a device-to-device copy on stream s.
func (c *Client) CopyDtoDAsync(dst, src DevicePtr, n uint64, s Stream) error {
	return c.post(abi.OpCopyDtoD, &abi.CopyDtoD{Dst: uint64(dst), Src: uint64(src), Size: n, Stream: uint64(s)})
}

// Memset8 sets count bytes at dst to v and waits for it.
func (c *Client) Memset8(dst DevicePtr, v uint8, count uint64) error {
	return c.call(abi.OpMemset, &abi.Memset{Dst: uint64(dst), Width: 1, Value: uint32(v), Count: count}, nil)
}

// Memset32 sets count 32-bit words at dst to v and waits for it.
func (c *Client) Memset32(dst DevicePtr, v uint32, count uint64) error {
	return c.call(abi.OpMemset, &abi.Memset{Dst: uint64(dst), Width: 4, Value: v, Count: count}, nil)
}

// Memset32Async queues a 32-bit memset on stream s.
func (c *Client) Memset32Async(dst DevicePtr, v uint32, count uint64, s Stream) error {
	return c.post(abi.OpMemset, &abi.Memset{Dst: uint64(dst), Width: 4, Value: v, Count: count, Stream: uint64(s)})
}

// Memset sets count elements of width bytes (1, 2 or 4) at dst to v: it
// waits for it when sync is set, else queues it on stream s.
func (c *Client) Memset(dst DevicePtr, width uint8, v uint32, count uint64, s Stream, sync bool) error {
	req := &abi.Memset{Dst: uint64(dst), Width: width, Value: v, Count: count, Stream: uint64(s)}
	if sync {
		return c.call(abi.OpMemset, req, nil)
	}
	return c.post(abi.OpMemset, req)
}

// DeviceInfo describes the node's device (see abi.DeviceInfoReply).
func (c *Client) DeviceInfo() (abi.DeviceInfoReply, error) {
	var r abi.DeviceInfoReply
	err := c.call(abi.OpDeviceInfo, &abi.DeviceInfo{}, &r)
	return r, err
}

// UnloadModule unloads m; functions taken from it become invalid.
func (c *Client) UnloadModule(m Module) error {
	return c.call(abi.OpModuleUnload, &abi.ModuleUnload{Module: uint64(m)}, nil)
}

// GetFunction returns the kernel called name in module m.
func (c *Client) GetFunction(m Module, name string) (Function, error) {
	var r abi.HandleReply
	err := c.call(abi.OpGetFunction, &abi.GetFunction{Module: uint64(m), Name: name}, &r)
	return Function(r.Handle), err
}

// FunctionParams returns where each parameter of f goes in its parameter
// buffer, for a function taken from a raw (cubin or fatbin) image (empty
// for a kernel its module declared), and f's attributes.
// The attributes are the GPU's CUfunction_attribute values, where the
// primary's GPU reports them.
func (c *Client) FunctionParams(f Function) ([]abi.ParamSlot, []int32, error) {
	var r abi.FunctionParamsReply
	err := c.call(abi.OpFunctionParams, &abi.FunctionParams{Function: uint64(f)}, &r)
	return r.Slots, r.Attrs, err
}

// DeviceStatus reads the live state of the node's device and the memory
// this guest holds (abi.DeviceStatusReply: the values the node has).
func (c *Client) DeviceStatus() (abi.DeviceStatusReply, error) {
	var r abi.DeviceStatusReply
	err := c.call(abi.OpDeviceStatus, &abi.DeviceStatus{}, &r)
	return r, err
}

// EncodeTensorMapTiled has the node's GPU driver encode a tensor map
// (abi.TensorMapEncode; the node checks the tensor lies in the session's
// memory).
func (c *Client) EncodeTensorMapTiled(r *abi.TensorMapEncode) ([abi.TensorMapBytes]byte, error) {
	var rep abi.TensorMapReply
	err := c.call(abi.OpTensorMapEncode, r, &rep)
	return rep.Map, err
}

// Occupancy asks the node's GPU driver an occupancy question
// (abi.Occupancy); q.Function is a function of this session.
func (c *Client) Occupancy(q *abi.Occupancy) (int32, error) {
	var rep abi.OccupancyReply
	err := c.call(abi.OpOccupancy, q, &rep)
	return rep.Value, err
}

// LaunchConfig is the shape of a launch.
type LaunchConfig struct {
	Grid, Block abi.Dim3
	SharedBytes uint32
	Stream      Stream
	// Cluster is the thread-block cluster shape (zero: none).
	Cluster abi.Dim3
	// Cooperative asks for every block resident at once
	// (cuLaunchCooperativeKernel); a grid larger than the GPU holds fails
	// with abi.StatusCooperativeTooLarge at the next synchronization.
	Cooperative bool
}

// Dim is a convenience for a Dim3 with y and z of one.
func Dim(x uint32) abi.Dim3 { return abi.Dim3{X: x, Y: 1, Z: 1} }

// Kernel argument constructors.
func Ptr(p DevicePtr) abi.Arg  { return abi.Ptr(uint64(p)) }
func U32(v uint32) abi.Arg     { return abi.U32(v) }
func U64(v uint64) abi.Arg     { return abi.U64(v) }
func F32(v float32) abi.Arg    { return abi.F32(v) }
func F64(v float64) abi.Arg    { return abi.F64(v) }
func Bytes(raw []byte) abi.Arg { return abi.Bytes(raw) }

// Launch queues a kernel launch. Like cuLaunchKernel it returns before the
// kernel runs; its errors surface at the next synchronization.
func (c *Client) Launch(f Function, cfg LaunchConfig, args ...abi.Arg) error {
	return c.post(abi.OpLaunch, &abi.Launch{
		Function: uint64(f), Grid: cfg.Grid, Block: cfg.Block,
		SharedBytes: cfg.SharedBytes, Stream: uint64(cfg.Stream), Args: args, Cluster: cfg.Cluster,
		Cooperative: cfg.Cooperative,
	})
}

// CreateStream creates a stream.
func (c *Client) CreateStream() (Stream, error) {
	var r abi.HandleReply
	err := c.call(abi.OpStreamCreate, &abi.StreamCreate{}, &r)
	return Stream(r.Handle), err
}

// DestroyStream destroys s.
func (c *Client) DestroyStream(s Stream) error {
	return c.call(abi.OpStreamDestroy, &abi.StreamDestroy{Stream: uint64(s)}, nil)
}

// StreamSynchronize waits for s and returns the first error of the work
// queued on it since the last synchronization.
func (c *Client) StreamSynchronize(s Stream) error {
	return c.call(abi.OpStreamSync, &abi.StreamSync{Stream: uint64(s)}, nil)
}

// Synchronize waits for all of the session's work and returns the first
// deferred error of any stream.
func (c *Client) Synchronize() error { return c.call(abi.OpSync, &abi.Sync{}, nil) }

// Dim3 is a convenience for a two-dimensional Dim3 with z of one.
func Dim3(x, y uint32) abi.Dim3 { return abi.Dim3{X: x, Y: y, Z: 1} }
