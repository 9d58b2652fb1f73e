package replicate

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"time"

	"github.com/vgpuha/vgpuha/replicate/admission"
	"github.com/vgpuha/vgpuha/replicate/link"
	"github.com/vgpuha/vgpuha/replicate/verify"
)

// Applier applies records to the replica.
type Applier interface {
	// Apply applies one record, deterministically (like raft's FSM.Apply):
	// the same records in the same order always give the same replica. An
	// error means the replica could not do what the primary did; the
	// applier keeps the divergence for status and verify, and the stream
	// goes on.
	Apply(r *Record) error
	// Checksums describes every replica object for verify.
	Checksums() []verify.ObjectSum
}

// Replica is the node a Receiver feeds: it applies records and is told
// what the link observes. Its role authority decides; the receiver never
// computes a role or a term.
type Replica interface {
	Applier
	// Heard: a message arrived from the primary, under term (0 when the
	// message carries none). It feeds the failure detector.
	Heard(term uint64)
	// Synced: the replica became a complete copy (true: a snapshot or a
	// resume completed) or stopped being one (false: a resync began).
	Synced(inSync bool)
	// HandOver: the primary asks this node to take over now. It returns
	// the node's new term, or false when the node may not take over.
	HandOver() (term uint64, ok bool)
}

// ReceiverConfig configures the standby's end of the link.
type ReceiverConfig struct {
	Key     []byte
	Replica Replica
	Logger  *slog.Logger
	// AckInterval bounds how long an applied record waits to be
	// acknowledged; acks also go out whenever the stream pauses.
	AckInterval time.Duration
	// Observe, when set, receives each record's apply time.
	Observe func(op Op, d time.Duration)
	// HostBuffer, when set, allocates the region records are received
	// into (see gpu.HostAllocator); NewReceiver asks it for one of
	// maxLentBytes at once (~0.3 s of page-locking on a GPU host) and uses
	// what it returns, smaller or not (a record larger than the region is
	// received on the heap).
	HostBuffer func(n int) []byte
	// Faults, when set, sees every message the standby sends (tests only).
	Faults link.FaultHook
	// Group, when set, is the only group whose primaries this standby
	// follows (package admission); Adopt arms an adoption: the first primary to
	// connect is followed whatever its group.
	Group string
	Adopt bool
}

// ReceiverStatus is the standby's view of replication.
type ReceiverStatus struct {
	Connected       bool   `json:"connected"`
	Primary         string `json:"primary,omitempty"`
	Mode            string `json:"mode"`
	Applied         uint64 `json:"applied_seq"`
	Received        uint64 `json:"received_seq"`
	Resyncing       bool   `json:"resyncing"`
	SnapshotRecords uint64 `json:"snapshot_records_applied"`
	EpochBuffered   int    `json:"epoch_buffered_records"`
	ApplyErrors     uint64 `json:"apply_errors"`
	// RefusedPeers counts the primaries refused, for any reason;
	// Refused by reason (RefuseReason's names).
	RefusedPeers uint64            `json:"refused_peers"`
	Refused      map[string]uint64 `json:"refused_by_reason,omitempty"`
	// Follows is the primary this standby follows (nil: none yet).
	Follows *admission.Identity `json:"follows,omitempty"`
	// Fenced: this node was promoted (under FencedTerm); it no longer
	// takes a stream and answers a returning primary with that term.
	Fenced     bool   `json:"fenced"`
	FencedTerm uint64 `json:"fenced_term,omitempty"`
	// InSync: a snapshot or resume completed and records stream live, so
	// the replica is a complete copy up to Applied. It is false from a
	// resync's reset to its snapshot's end: a half-copied replica never
	// takes over.
	InSync bool `json:"in_sync"`
	// MinTerm: the node was told (by its coordinator) that a leader holds
	// this term; links under a lower one are refused (StaleRefused).
	MinTerm      uint64 `json:"min_term,omitempty"`
	StaleRefused uint64 `json:"stale_term_refusals,omitempty"`
	// Resync: the snapshot applied so far (record bytes, of about
	// BytesTotal contents bytes).
	Resync ResyncProgress `json:"resync"`
}

// Receiver accepts the primary's stream and applies it. A link goes
// through three phases, each its own function: admit (authenticate, take
// over from an older link, refuse when fenced), the state/mode exchange,
// and stream (one handler per message type, acks on their own goroutine).
type Receiver struct {
	cfg ReceiverConfig

	linkMu sync.Mutex // one link applies at a time

	lender *link.Lender // receive buffers lent to the applier

	mu        sync.Mutex
	logID     uint64
	resyncLog uint64 // the log of the resync under way
	received  uint64 // last sequence read off the link (queued or applied)
	applied   uint64
	mode      Mode
	epochBuf  []Record
	st        ReceiverStatus
	current   net.Conn
	progress  progress
	// follows is the primary followed, adopt an armed adoption, refused
	// the refusals by reason (package admission).
	follows *admission.Identity
	adopt   bool
	refused [admission.NumRefuseReasons]uint64
}

// NewReceiver returns a receiver.
func NewReceiver(cfg ReceiverConfig) (*Receiver, error) {
	if len(cfg.Key) < link.MinKeyBytes {
		return nil, fmt.Errorf("replication key must be at least %d bytes", link.MinKeyBytes)
	}
	if cfg.Replica == nil {
		return nil, errors.New("a receiver needs a replica to apply to")
	}
	if cfg.AckInterval == 0 {
		cfg.AckInterval = 100 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := admission.CheckGroup(cfg.Group); err != nil {
		return nil, err
	}
	r := &Receiver{cfg: cfg, lender: link.NewLender(maxLentBytes), adopt: cfg.Adopt}
	if cfg.HostBuffer != nil {
		// Made now rather than while the first resync waits for them,
		// and before a primary can connect: page-locking memory holds a
		// driver lock that a primary's calls on the same host wait for.
		r.lender.UseRegion(cfg.HostBuffer(maxLentBytes))
	}
	return r, nil
}

// maxLentBytes bounds the record bytes read but not yet applied: past it
// the standby stops reading and the primary's log bound slows its guests.
const maxLentBytes = 256 << 20

// lendAbove: a frame at least this large is read into a buffer of its own
// (lent until its record is applied), opened on a worker while the next
// frames are read; a smaller one is read into the link's buffer, opened
// by the reader, and its record's body copied.
const lendAbove = 64 << 10

// Status reports the receiver's state.
func (r *Receiver) Status() ReceiverStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.st
	st.Applied, st.Received, st.Mode, st.EpochBuffered = r.applied, max(r.received, r.applied), r.mode.String(), len(r.epochBuf)
	st.Resync = r.progress.status()
	if r.follows != nil {
		f := *r.follows
		st.Follows = &f
	}
	for reason, n := range r.refused {
		if n > 0 {
			if st.Refused == nil {
				st.Refused = map[string]uint64{}
			}
			st.Refused[admission.RefuseReason(reason).String()] = n
		}
	}
	return st
}

// Serve accepts primaries on ln until it is closed. A newly authenticated
// primary replaces the current link.
func (r *Receiver) Serve(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		go r.serveConn(c)
	}
}

// Close drops the current link.
func (r *Receiver) Close() {
	r.mu.Lock()
	if r.current != nil {
		r.current.Close()
	}
	r.mu.Unlock()
}

// serveConn runs one primary's link from handshake to its end.
func (r *Receiver) serveConn(c net.Conn) {
	defer c.Close()
	log := r.cfg.Logger.With("primary", c.RemoteAddr().String())
	l, err := link.ServerHandshake(c, r.cfg.Key, 5*time.Second)
	var hello admission.Identity
	if err == nil {
		hello, err = readIdentity(l, 5*time.Second)
	}
	if err != nil {
		r.count(admission.RefusedAuth)
		log.Warn("refused replication peer", "reason", admission.RefusedAuth, "err", err)
		return
	}
	l.Faults, l.Out, l.Lender = r.cfg.Faults, link.FromStandby, r.lender
	l.Peer = c.RemoteAddr().String()
	// Only an admitted primary takes over from the previous link (the
	// primary reconnected, or its successor); its goroutine then lets go
	// of linkMu.
	if !r.judge(c, l, hello, log) {
		return
	}
	r.linkMu.Lock()
	defer r.linkMu.Unlock()
	state, ok := r.admit(c, l, log)
	if !ok {
		return
	}
	defer func() {
		r.mu.Lock()
		if r.current == c {
			r.current = nil
			r.st.Connected = false
		}
		r.mu.Unlock()
	}()
	if l.WriteFlush(link.MsgState, state) != nil {
		return
	}
	r.stream(&linkRun{r: r, l: l, log: log, kick: make(chan struct{}, 1), queue: make(chan applyItem, applyQueue)})
}

// readIdentity reads the primary's identity, the first frame on an
// authenticated link.
func readIdentity(l *link.Conn, timeout time.Duration) (admission.Identity, error) {
	l.Raw.SetReadDeadline(time.Now().Add(timeout))
	defer l.Raw.SetReadDeadline(time.Time{})
	typ, payload, err := l.Read()
	if err != nil {
		return admission.Identity{}, fmt.Errorf("reading the primary's identity: %w", err)
	}
	if typ != link.MsgIdentity {
		return admission.Identity{}, fmt.Errorf("%w: a %s message where the primary's identity belongs", link.ErrCorrupt, link.MsgNames[typ])
	}
	return decodeIdentity(payload)
}

// judge decides whether the primary presenting hello on c may stream
// (admissionRules). Admitted, it is followed and c replaces the current
// link; refused, it is told why (a promoted node's term, or the reason
// and whom this standby follows), and the refusal is counted and logged.
// Nothing of the replica changes either way.
func (r *Receiver) judge(c net.Conn, l *link.Conn, hello admission.Identity, log *slog.Logger) bool {
	r.mu.Lock()
	v := admission.View{Fenced: r.st.Fenced, MinTerm: r.st.MinTerm, Pinned: r.cfg.Group, Adopt: r.adopt,
		Follows: r.follows, LogID: r.logID, Applied: r.applied}
	verdict := v.Admit(&hello)
	var follows admission.Identity
	if r.follows != nil {
		follows = *r.follows
	}
	follows.Term = max(follows.Term, r.st.MinTerm)
	fencedTerm := r.st.FencedTerm
	if verdict.Refuse == 0 {
		r.follows = &admission.Identity{Group: hello.Group, Primary: hello.Primary, Term: hello.Term}
		r.adopt = r.adopt && !verdict.Adopts
		if r.current != nil {
			r.current.Close()
		}
		r.current = c
	}
	r.mu.Unlock()
	args := []any{"group", hello.Group, "primary_id", fmt.Sprintf("%016x", hello.Primary), "term", hello.Term}
	switch {
	case verdict.Refuse == admission.RefusedFenced:
		r.count(admission.RefusedFenced)
		l.WriteFlush(link.MsgFenced, binary.LittleEndian.AppendUint64(make([]byte, 0, 8+link.MacSize), fencedTerm))
		log.Warn("refused a primary's stream: this node was promoted", append(args, "our_term", fencedTerm)...)
		return false
	case verdict.Refuse != 0:
		r.count(verdict.Refuse)
		l.WriteFlush(link.MsgRefused, appendRefusal(make([]byte, 0, 1+identityFixed+len(follows.Group)+link.MacSize), verdict.Refuse, follows))
		log.Warn("refused a primary's stream; the replica is unchanged", append(args, "reason", verdict.Refuse,
			"follows_group", follows.Group, "follows_primary_id", fmt.Sprintf("%016x", follows.Primary), "follows_term", follows.Term)...)
		return false
	case verdict.How != "":
		log.Info("following a primary", append(args, "as", verdict.How)...)
	}
	return true
}

// count counts one refusal.
func (r *Receiver) count(reason admission.RefuseReason) {
	r.mu.Lock()
	r.st.RefusedPeers++
	r.refused[reason]++
	r.mu.Unlock()
}

// Followed returns the id of the primary this standby follows (false:
// none yet). Its heartbeats are heard, any other's are not.
func (r *Receiver) Followed() (primary uint64, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.follows == nil {
		return 0, false
	}
	return r.follows.Primary, true
}

// armAdoption arms an adoption, as ReceiverConfig.Adopt does at start:
// the next primary to connect is followed whatever its group or id (its
// replica replaced), unless it is below a term this standby knows.
func (r *Receiver) armAdoption() {
	r.mu.Lock()
	r.adopt = true
	r.mu.Unlock()
}

// admit lets c's primary stream, unless a newer link replaced c meanwhile
// or this node was promoted: then the primary is told the newer term and
// refused. It returns the standby's state message.
// Precondition: r.linkMu must be locked.
func (r *Receiver) admit(c net.Conn, l *link.Conn, log *slog.Logger) ([]byte, bool) {
	r.mu.Lock()
	if r.current != c {
		r.mu.Unlock()
		return nil, false
	}
	if r.st.Fenced {
		term := r.st.FencedTerm
		r.mu.Unlock()
		l.WriteFlush(link.MsgFenced, binary.LittleEndian.AppendUint64(make([]byte, 0, 8+link.MacSize), term))
		log.Warn("refused a primary's stream: this node was promoted", "term", term)
		return nil, false
	}
	r.st.Connected, r.st.Primary = true, c.RemoteAddr().String()
	state := binary.LittleEndian.AppendUint64(nil, r.logID)
	state = binary.LittleEndian.AppendUint64(state, r.applied)
	r.mu.Unlock()
	return state, true
}

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
	rec Record
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

// onMode: the primary's mode and term, known before any record, so that a
// standby that takes over always does so under a term above the primary's.
func (lr *linkRun) onMode(f *link.Frame) bool {
	payload := f.Payload
	if len(payload) != 16 {
		lr.log.Warn("bad mode message; dropping link")
		return false
	}
	if lr.stale(binary.LittleEndian.Uint64(payload[8:])) {
		return false
	}
	lr.r.mu.Lock()
	lr.r.mode = Mode(binary.LittleEndian.Uint64(payload))
	lr.r.mu.Unlock()
	lr.r.cfg.Replica.Heard(binary.LittleEndian.Uint64(payload[8:]))
	return true
}

// RefuseBelow tells the receiver that a leader holds term (its node's
// coordinator saw it): a primary streaming under a lower term was deposed,
// so its link is refused and it is told the term; nothing it sends is
// applied.
func (r *Receiver) RefuseBelow(term uint64) {
	r.mu.Lock()
	r.st.MinTerm = max(r.st.MinTerm, term)
	r.mu.Unlock()
}

// stale reports (and answers) a message under a term below MinTerm.
func (lr *linkRun) stale(term uint64) bool {
	lr.r.mu.Lock()
	low := term != 0 && term < lr.r.st.MinTerm
	floor := lr.r.st.MinTerm
	if low {
		lr.r.st.StaleRefused++
		lr.r.st.RefusedPeers++
		lr.r.refused[admission.RefusedStaleTerm]++
	}
	lr.r.mu.Unlock()
	if low {
		lr.l.WriteFlush(link.MsgFenced, binary.LittleEndian.AppendUint64(make([]byte, 0, 8+link.MacSize), floor))
		lr.log.Warn("refused a deposed primary's stream", "term", term, "leader_term", floor)
	}
	return low
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
	rec, err := DecodeRecord(f.Payload)
	if err != nil {
		lr.log.Warn("dropping link", "err", err)
		return false
	}
	if lr.stale(rec.Term) {
		return false
	}
	rec.bodyCRC, rec.hasCRC = f.BodyCRC, f.HasCRC
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

// applier applies queued records in order until the queue is closed. A
// protocol violation (a gap) ends the link; what follows it is dropped.
// It asks for an ack whenever it caught up, and every ackEveryBytes of
// log records applied while it works through a backlog: the primary's log
// releases (and its waiting guests go on) as the standby applies, not
// once per AckInterval. A replica that queues copies (Settler) keeps the
// buffers they read until it settled them (see settling).
func (lr *linkRun) applier(done chan<- struct{}) {
	defer close(done)
	held := newSettling(lr.r)
	defer held.settle()
	broken := false
	sinceAck := 0
	for {
		item, ok := held.next(lr.queue)
		if !ok {
			return
		}
		if !broken {
			reply, err := lr.r.handle(&item.rec)
			switch {
			case err != nil:
				lr.log.Warn("dropping link", "err", err)
				broken = true
				lr.l.Raw.Close()
			case reply != nil && lr.l.WriteFlush(link.MsgVerifyReply, reply) != nil:
				broken = true
			}
		}
		idle := len(lr.queue) == 0
		if item.rec.Seq != 0 {
			sinceAck += item.rec.Size()
		}
		if idle || sinceAck >= ackEveryBytes {
			sinceAck = 0
			select {
			case lr.kick <- struct{}{}:
			default:
			}
		}
		held.add(item.buf) // after the ack: queued work counts as applied
		if len(item.rec.Body) >= lendAbove {
			runtime.Gosched() // a large apply lets others on this host run (a guest on a shared one)
		}
	}
}

// Settler is an Applier whose Apply may leave device work queued that
// still reads the record's body (a copy from the page-locked buffer it
// arrived in). The receiver keeps those buffers unchanged until the work
// is settled: it marks the work every settleEveryBytes of buffers and
// settles the mark before the last, so the device works through one run
// of records while the applier queues the next; once no record came for
// settleIdle, it settles all. A Settle error means queued work failed:
// the replica may differ from the primary (counted and logged as a
// failed apply).
type Settler interface {
	// Mark notes how far the queued work has come.
	Mark() uint64
	// Settle returns once no work queued before Mark returned upTo (or
	// an earlier mark) reads a record's body.
	Settle(upTo uint64) error
}

// settleEveryBytes is the receive buffers in one marked run of a
// Settler's queued work; the applier holds at most two runs (well below
// maxLentBytes, so the link keeps reading while they wait).
const settleEveryBytes = 32 << 20

// settleIdle is how long the applier, caught up, waits for the next
// record before it settles all it holds (and gives the buffers back).
// Settling at once each time it caught up had it wait for the device
// after nearly every record while a standby caught up over a fast link
// (37% of its time, measured on the H200 host), since records then come
// a little slower than it applies them.
const settleIdle = time.Millisecond

// settling holds the lent buffers of records applied since the replica
// last settled their queued work; a replica that queues none gets each
// back at once.
type settling struct {
	r       *Receiver
	run     [][]byte // buffers since the last mark
	bytes   int      // in run
	marked  [][]byte // buffers of the last mark's run, not yet settled
	mark    uint64   // that mark
	settler Settler  // nil: the replica queues nothing
	idle    *time.Timer
}

func newSettling(r *Receiver) *settling {
	s := &settling{r: r}
	s.settler, _ = r.cfg.Replica.(Settler)
	return s
}

// next returns the next record to apply (false once the queue is
// closed). While the queue is empty and buffers are held, it settles
// them if no record comes within settleIdle: held buffers then never keep
// the link's reader waiting for long for a buffer to read into.
func (s *settling) next(queue <-chan applyItem) (applyItem, bool) {
	if len(s.run)+len(s.marked) > 0 && len(queue) == 0 {
		if s.idle == nil {
			s.idle = time.NewTimer(settleIdle)
		} else {
			s.idle.Reset(settleIdle)
		}
		select {
		case item, ok := <-queue:
			s.idle.Stop()
			return item, ok
		case <-s.idle.C:
			s.settle()
		}
	}
	item, ok := <-queue
	return item, ok
}

// add holds buffer buf (nil: none) until the work that reads it is
// settled.
func (s *settling) add(buf []byte) {
	switch {
	case buf == nil:
	case s.settler == nil:
		s.r.lender.Give(buf)
	default:
		s.run, s.bytes = append(s.run, buf), s.bytes+cap(buf)
	}
	if s.bytes >= settleEveryBytes {
		if len(s.marked) > 0 { // the run before: the device has likely done it
			s.wait(s.mark)
			s.give(s.marked)
		}
		s.mark = s.settler.Mark()
		s.marked, s.run, s.bytes = s.run, s.marked[:0], 0
	}
}

// settle waits for all the replica's queued work and gives every buffer
// back.
func (s *settling) settle() {
	if len(s.run)+len(s.marked) == 0 {
		return
	}
	s.wait(s.settler.Mark())
	s.give(s.marked)
	s.give(s.run)
	s.marked, s.run, s.bytes = s.marked[:0], s.run[:0], 0
}

// wait settles the replica's work up to mark; a failure is counted and
// logged as a failed apply.
func (s *settling) wait(mark uint64) {
	if err := s.settler.Settle(mark); err != nil {
		s.r.mu.Lock()
		s.r.st.ApplyErrors++
		s.r.mu.Unlock()
		s.r.cfg.Logger.Warn("replica diverged: queued work failed", "err", err)
	}
}

func (s *settling) give(bufs [][]byte) {
	for i, buf := range bufs {
		s.r.lender.Give(buf)
		bufs[i] = nil
	}
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

// handle applies or buffers one record. It returns a verify reply to send,
// or an error that ends the link (a protocol violation, never a failed
// apply).
func (r *Receiver) handle(rec *Record) ([]byte, error) {
	r.mu.Lock()
	mode, applied := r.mode, r.applied
	r.mu.Unlock()
	switch {
	case rec.Op == OpReset:
		r.reset(rec)
		return nil, nil
	case rec.Seq == 0: // part of a snapshot
		r.snapshotRecord(rec)
		return nil, nil
	case rec.Seq != applied+1:
		return nil, fmt.Errorf("record %d after %d: the stream has a gap", rec.Seq, applied)
	}
	var reply []byte
	switch {
	case rec.Op == OpVerify:
		reply = encodeSums(rec.Result, r.cfg.Replica.Checksums())
	case mode == ModeEpoch && rec.Op == OpEpoch:
		r.mu.Lock()
		buf := r.epochBuf
		r.epochBuf = nil
		r.mu.Unlock()
		for i := range buf {
			r.apply(&buf[i])
		}
	case mode == ModeEpoch:
		cp := *rec
		cp.Body = append([]byte(nil), rec.Body...)
		r.mu.Lock()
		r.epochBuf = append(r.epochBuf, cp)
		r.mu.Unlock()
	default:
		r.apply(rec)
	}
	r.mu.Lock()
	r.applied = rec.Seq
	r.mu.Unlock()
	return reply, nil
}

// reset starts a resync: the replica is dropped and rebuilt from the
// snapshot that follows.
func (r *Receiver) reset(rec *Record) {
	r.apply(rec)
	r.mu.Lock()
	// The log's id is claimed only at the snapshot's end: a standby cut
	// off mid-snapshot must resync again, never resume from a log whose
	// start (a promoted primary's log begins at 0) it has not applied.
	r.logID, r.resyncLog, r.applied, r.epochBuf = 0, rec.Result, 0, nil
	r.st.Resyncing, r.st.SnapshotRecords, r.st.InSync = true, 0, false
	r.mu.Unlock()
	r.cfg.Replica.Synced(false)
	total := resetTotal(rec.Body)
	r.progress.begin(total)
	r.cfg.Logger.Info("resync started: replica reset; not in sync until the snapshot ends", "bytes", total)
}

// snapshotRecord applies one record of a snapshot, or ends it.
func (r *Receiver) snapshotRecord(rec *Record) {
	if rec.Op == OpSnapshotEnd {
		r.mu.Lock()
		r.logID, r.applied, r.st.Resyncing, r.st.InSync = r.resyncLog, rec.Result, false, true
		n := r.st.SnapshotRecords
		r.mu.Unlock()
		r.progress.end()
		r.cfg.Replica.Synced(true)
		r.cfg.Logger.Info("resync snapshot applied; in sync, catching up from the log", "records", n, "position", rec.Result)
		return
	}
	r.apply(rec)
	r.mu.Lock()
	r.st.SnapshotRecords++
	n := r.st.SnapshotRecords
	r.mu.Unlock()
	if r.progress.add(uint64(len(rec.Body))) {
		r.cfg.Logger.Info("resync in progress", append(r.progress.status().logArgs(), "snapshot_records", n)...)
	}
}

func (r *Receiver) apply(rec *Record) {
	start := time.Now()
	err := r.cfg.Replica.Apply(rec)
	if r.cfg.Observe != nil {
		r.cfg.Observe(rec.Op, time.Since(start))
	}
	if err != nil {
		r.mu.Lock()
		r.st.ApplyErrors++
		r.mu.Unlock()
		r.cfg.Logger.Warn("replica diverged", "seq", rec.Seq, "session", rec.Session, "op", rec.Op, "err", err)
	}
}

// Fence makes this receiver stop applying for good (its node was promoted
// under term): the current link is dropped, and a primary that connects
// later is told the term so it stops serving. It returns once the link's
// goroutine has stopped applying.
func (r *Receiver) Fence(term uint64) {
	r.mu.Lock()
	r.st.Fenced, r.st.FencedTerm = true, max(term, r.st.FencedTerm)
	if r.current != nil {
		r.current.Close()
	}
	r.mu.Unlock()
	r.linkMu.Lock()
	r.linkMu.Unlock()
}

// DiscardEpoch drops records of an uncommitted epoch (at failover) and
// returns how many were dropped.
func (r *Receiver) DiscardEpoch() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(r.epochBuf)
	r.epochBuf = nil
	return n
}

// sumRecordBody takes the CRC-32C of the opened record's body when the
// record carries a guest request (Record.BodyCRC): a worker does it while
// the applier applies the records before.
func sumRecordBody(f *link.Frame) {
	if rec, err := DecodeRecord(f.Payload); err == nil && rec.ReqID != 0 {
		f.BodyCRC, f.HasCRC = crc32.Checksum(rec.Body, castagnoli), true
	}
}
