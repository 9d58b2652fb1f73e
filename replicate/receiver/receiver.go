package receiver

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/vgpuha/vgpuha/replicate"
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
	// goes on. With ReceiverConfig.ParallelSessions, Apply is called
	// concurrently for records of different sessions whose kinds are
	// SessionScoped; one session's records, and every other record, come
	// in log order, the latter with no other Apply under way.
	Apply(r *replicate.Record) error
	// Checksums describes every replica object for verify.
	Checksums() []verify.ObjectSum
}

// Idler is an Applier that holds work back to batch it (a GPU worker's
// launches): the receiver tells it when it has applied every record of a
// session it has for now (a lane's queue is empty), or of every session
// (session 0: the applier caught up, or the link ended).
type Idler interface {
	Idle(session uint64)
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
	Observe func(op replicate.Op, d time.Duration)
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
	// ParallelSessions applies different sessions' records side by side,
	// each session's in order (lanes.go); false: one record at a time.
	ParallelSessions bool
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
	Resync replicate.ResyncProgress `json:"resync"`
	// KeyRefused: the last peer refused for failing authentication since
	// a primary was last admitted (nil: none).
	KeyRefused *KeyRefusal `json:"key_refused,omitempty"`
}

// KeyRefusal is a peer refused at authentication: a primary holding
// another key (WrongKey), or a peer that did not complete the handshake.
type KeyRefusal struct {
	Peer     string    `json:"peer"` // its host (the port is the dialer's)
	At       time.Time `json:"at"`
	WrongKey bool      `json:"wrong_key"`
	Err      string    `json:"err"`
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
	mode      replicate.Mode
	epochBuf  []replicate.Record
	st        ReceiverStatus
	current   net.Conn
	progress  replicate.ResyncTracker
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
	st.Resync = r.progress.Status()
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
		r.refuseAuth(c.RemoteAddr(), err, log)
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
	return replicate.DecodeIdentity(payload)
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
		r.st.KeyRefused = nil // a primary holding the key is here
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
		l.WriteFlush(link.MsgRefused, replicate.AppendRefusal(make([]byte, 0, 1+replicate.IdentityFixed+len(follows.Group)+link.MacSize), verdict.Refuse, follows))
		log.Warn("refused a primary's stream; the replica is unchanged", append(args, "reason", verdict.Refuse,
			"follows_group", follows.Group, "follows_primary_id", fmt.Sprintf("%016x", follows.Primary), "follows_term", follows.Term)...)
		return false
	case verdict.How != "":
		log.Info("following a primary", append(args, "as", verdict.How)...)
	}
	return true
}

// refuseAuth counts and notes a peer refused at authentication; one
// holding another key is a primary set up with the wrong key file, and
// the log says how to fix it.
func (r *Receiver) refuseAuth(peer net.Addr, err error, log *slog.Logger) {
	host := peer.String()
	if h, _, splitErr := net.SplitHostPort(host); splitErr == nil {
		host = h
	}
	wrongKey := errors.Is(err, link.ErrAuth)
	r.mu.Lock()
	r.st.KeyRefused = &KeyRefusal{Peer: host, At: time.Now(), WrongKey: wrongKey, Err: err.Error()}
	r.mu.Unlock()
	r.count(admission.RefusedAuth)
	if wrongKey {
		log.Warn("refused a primary: its replication key differs from this node's; put the same key file on both nodes (copy the primary's to this node and restart it)",
			"reason", admission.RefusedAuth, "err", err)
		return
	}
	log.Warn("refused replication peer", "reason", admission.RefusedAuth, "err", err)
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
	lr.r.mode = replicate.Mode(binary.LittleEndian.Uint64(payload))
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
