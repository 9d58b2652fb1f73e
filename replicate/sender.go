package replicate

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpuha/vgpuha/replicate/admission"
	"github.com/vgpuha/vgpuha/replicate/internal/bufpool"
	"github.com/vgpuha/vgpuha/replicate/link"
	"github.com/vgpuha/vgpuha/replicate/verify"
)

// Protected is the node a Sender protects. The sender reports what the
// standby says; it never decides the node's role or term.
type Protected interface {
	// Snapshot takes a resync snapshot: with every session stopped, for a
	// time bounded independently of the memory size, it calls
	// Log.BeginSnapshot and captures the state at that position; the
	// snapshot then yields records (Seq 0, FlagPlaced) that rebuild it,
	// while guests run.
	Snapshot() (Snapshot, error)
	// Term is the node's term, stamped on heartbeats and the stream.
	Term() uint64
	// PeerTerm reports that the standby answered with its own term: it
	// was promoted. The node's role authority decides what follows.
	PeerTerm(term uint64)
}

// SenderConfig configures the primary's end of the replication link.
type SenderConfig struct {
	Addr   string // standby's host:port
	Key    []byte // pre-shared key, at least MinKeyBytes
	Mode   Mode
	Log    *Log
	Logger *slog.Logger
	// AckTimeout: a standby silent this long is dropped (it sends an ack at
	// least every AckInterval).
	AckTimeout time.Duration
	// Registry, when set, gets the sender's metrics.
	Registry prometheus.Registerer
	// Faults, when set, sees every message on the link (tests only).
	Faults link.FaultHook
	// ResyncRate bounds a resync's snapshot stream in bytes per second
	// (0: as fast as the link takes it).
	ResyncRate int64
	// Group names the pair this primary belongs to (package admission); empty:
	// this primary's id, as the first primary of a new group.
	Group string
}

// SenderStatus is the primary's view of replication.
type SenderStatus struct {
	State       string  `json:"state"` // unprotected, resyncing, protected
	Mode        string  `json:"mode"`
	Standby     string  `json:"standby"`
	Resyncs     uint64  `json:"resyncs"`
	LastPauseMS float64 `json:"last_resync_pause_ms"`
	LastResync  float64 `json:"last_resync_seconds"`
	// LastResyncBytes is what the link carried during the last resync, from
	// the standby's attach until it protected: the snapshot and the records
	// guests wrote meanwhile.
	LastResyncBytes uint64 `json:"last_resync_bytes"`
	// SentBytes is every record byte the link carried (snapshots
	// included), as vgpuha_replication_sent_bytes_total counts them.
	SentBytes uint64 `json:"sent_bytes"`
	// LastSnapshot is how long the last resync took to put its snapshot
	// on the link (the rest of LastResync was catching up from the log).
	LastSnapshot float64 `json:"last_resync_snapshot_seconds"`
	LastError    string  `json:"last_error,omitempty"`
	// ResyncRestarts counts resyncs that started over (the log outgrew
	// its resync budget, or the snapshot could not be read).
	ResyncRestarts uint64         `json:"resync_restarts"`
	Resync         ResyncProgress `json:"resync"`
	// Refused counts the standby's refusals of this primary by reason
	// (RefuseReason's names).
	Refused map[string]uint64 `json:"refused_by_reason,omitempty"`
	// Group and Primary are this primary's identity on the link.
	Group   string `json:"group"`
	Primary uint64 `json:"primary_id"`
	LogStatus
}

// Sender streams the log to the standby, reconnecting and resyncing as
// needed. A link goes through three phases, each its own function:
// connect (dial and authenticate), catchUp (resume from the log or resync
// from a snapshot) and stream (records out, acks and answers in).
type Sender struct {
	cfg      SenderConfig
	node     Protected
	log      *slog.Logger
	metrics  *Metrics
	verifier verify.Verifier
	cur      *cursor // this standby's position in the log

	mu         sync.Mutex
	resyncs    uint64
	lastPause  time.Duration
	lastResync time.Duration
	lastErr    string
	handover   chan uint64 // a switchover waiting for the standby's term
	link       *link.Conn  // the current link, for Handover
	resyncing  bool
	resyncFrom time.Time
	restarts   uint64
	progress   ResyncTracker
	// sent counts the record bytes sent (all links); resyncSent is its
	// value when the resync under way began, lastResyncBytes what the
	// last one carried.
	sent            atomic.Uint64
	resyncSent      uint64
	lastResyncBytes uint64
	// lastSnapshot: the last resync's start to its snapshot's end on the
	// link.
	lastSnapshot time.Duration
	// readAheadBufs are the buffers every resync reads the snapshot into
	// (one resync at a time per sender).
	readAheadBufs [][]byte
	// refused counts the standby's refusals by reason.
	refused [admission.NumRefuseReasons]uint64
}

// NewSender returns a sender protecting node; Run starts it.
func NewSender(cfg SenderConfig, node Protected) (*Sender, error) {
	if len(cfg.Key) < link.MinKeyBytes {
		return nil, fmt.Errorf("replication key must be at least %d bytes", link.MinKeyBytes)
	}
	if cfg.AckTimeout == 0 {
		cfg.AckTimeout = 3 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Group == "" {
		cfg.Group = fmt.Sprintf("%016x", cfg.Log.id)
	}
	if err := admission.CheckGroup(cfg.Group); err != nil {
		return nil, err
	}
	s := &Sender{cfg: cfg, node: node, log: cfg.Logger.With("standby", cfg.Addr), readAheadBufs: newReadAheadBufs()}
	if cfg.Registry != nil {
		m, err := NewMetrics(cfg.Registry, cfg.Addr, s.Status)
		if err != nil {
			return nil, err
		}
		s.metrics = m
	}
	s.cur = cfg.Log.addCursor(cfg.Addr)
	return s, nil
}

// Run connects and streams until ctx ends; the standby then leaves the log
// (and its sync set) for good. Heartbeats also go out as UDP datagrams to
// the same address (see link.SendUDPHeartbeats).
func (s *Sender) Run(ctx context.Context) {
	defer s.cfg.Log.removeCursor(s.cur)
	go link.SendUDPHeartbeats(ctx, s.cfg.Addr, s.cfg.Key, s.cfg.Log.id, s.node.Term, heartbeatEvery, s.heartbeatFailed)
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		err := s.session(ctx)
		s.cfg.Log.attach(s.cur, false, 0, false)
		if ctx.Err() != nil {
			return
		}
		s.mu.Lock()
		if err != nil && err.Error() != s.lastErr {
			s.log.Warn("replication link down; primary is unprotected", "err", err)
			s.lastErr = err.Error()
		}
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, time.Second)
	}
}

// Status reports the link's state.
func (s *Sender) Status() SenderStatus {
	ls := s.cfg.Log.peerStatus(s.cur)
	s.mu.Lock()
	defer s.mu.Unlock()
	st := SenderStatus{Mode: s.cfg.Mode.String(), Standby: s.cfg.Addr, Resyncs: s.resyncs,
		LastPauseMS: float64(s.lastPause.Microseconds()) / 1000, LastResync: s.lastResync.Seconds(), LastResyncBytes: s.lastResyncBytes,
		LastSnapshot: s.lastSnapshot.Seconds(), SentBytes: s.sent.Load(),
		LastError: s.lastErr, LogStatus: ls, State: "unprotected",
		ResyncRestarts: s.restarts, Resync: s.progress.Status(), Group: s.cfg.Group, Primary: s.cfg.Log.id}
	for reason, n := range s.refused {
		if n > 0 {
			if st.Refused == nil {
				st.Refused = map[string]uint64{}
			}
			st.Refused[admission.RefuseReason(reason).String()] = n
		}
	}
	switch {
	case ls.Protected:
		st.State = "protected"
	case ls.Attached:
		st.State = "resyncing"
	}
	return st
}

// Verify takes a verify point with point (which computes the primary's
// checksums and logs the request at the same position) and compares the
// standby's answer.
func (s *Sender) Verify(point func(id uint64) []verify.ObjectSum, timeout time.Duration) (verify.Report, error) {
	return s.verifier.Verify(point, timeout)
}

// session runs one link from dial to its end.
func (s *Sender) session(ctx context.Context) error {
	l, err := s.connect(ctx)
	if err != nil {
		return err
	}
	defer l.Raw.Close()
	after, err := s.catchUp(l)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.link = l
	s.lastErr = "" // the standby is caught up: what broke the last link is gone
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.link = nil
		s.mu.Unlock()
	}()
	return s.stream(ctx, l, after)
}

// connect dials the standby and authenticates both ends.
func (s *Sender) connect(ctx context.Context) (*link.Conn, error) {
	d := net.Dialer{Timeout: 2 * time.Second}
	c, err := d.DialContext(ctx, "tcp", s.cfg.Addr)
	if err != nil {
		return nil, err
	}
	c.(*net.TCPConn).SetNoDelay(true)
	l, err := link.ClientHandshake(c, s.cfg.Key, 5*time.Second)
	if err != nil {
		c.Close()
		return nil, err
	}
	l.Faults, l.Out, l.Peer = s.cfg.Faults, link.FromPrimary, s.cfg.Addr
	return l, nil
}

// identity is who this primary says it is on a new link.
func (s *Sender) identity() admission.Identity {
	return admission.Identity{Group: s.cfg.Group, Primary: s.cfg.Log.id, Term: s.node.Term(), Last: s.cfg.Log.Last()}
}

// catchUp introduces this primary, reads the standby's position (or its
// refusal), tells it the mode and term, and brings it up to date: from
// the log when it holds what the standby lacks, else from a snapshot. It
// returns the sequence streaming continues after.
func (s *Sender) catchUp(l *link.Conn) (uint64, error) {
	self := s.identity()
	if err := l.WriteFlush(link.MsgIdentity, AppendIdentity(make([]byte, 0, IdentityFixed+len(self.Group)+link.MacSize), self)); err != nil {
		return 0, err
	}
	l.Raw.SetReadDeadline(time.Now().Add(s.cfg.AckTimeout))
	typ, payload, err := l.Read()
	if err != nil {
		return 0, fmt.Errorf("reading standby state: %w", err)
	}
	switch typ {
	case link.MsgFenced:
		return 0, s.fenced(payload)
	case link.MsgRefused:
		return 0, s.refusedBy(payload, self)
	}
	if typ != link.MsgState || len(payload) != 16 {
		return 0, fmt.Errorf("%w: expected standby state", link.ErrCorrupt)
	}
	logID, applied := binary.LittleEndian.Uint64(payload), binary.LittleEndian.Uint64(payload[8:])
	mode := binary.LittleEndian.AppendUint64(make([]byte, 0, 16+link.MacSize), uint64(s.cfg.Mode))
	if err := l.Write(link.MsgMode, binary.LittleEndian.AppendUint64(mode, s.node.Term())); err != nil {
		return 0, err
	}
	if s.cfg.Log.resume(s.cur, logID, applied) {
		s.log.Info("standby attached; catching up from the log", "applied", applied)
		return applied, l.Flush()
	}
	return s.resync(l)
}

// resync sends a snapshot that replaces the standby's replica. Guests are
// stopped only while the node takes it; its contents stream while they
// run, and the log keeps what they change meanwhile, sent after it.
func (s *Sender) resync(l *link.Conn) (uint64, error) {
	lg := s.cfg.Log
	lg.attach(s.cur, true, 0, true)
	start := time.Now()
	snap, err := s.node.Snapshot()
	if err != nil {
		return 0, fmt.Errorf("taking a resync snapshot: %w", err)
	}
	defer snap.Close()
	pause := snap.Pause()
	_, total := snap.Progress()
	s.mu.Lock()
	s.resyncs++
	s.lastPause = pause
	s.resyncing, s.resyncFrom, s.resyncSent = true, start, s.sent.Load()
	s.mu.Unlock()
	s.progress.Begin(total)
	defer s.progress.End()
	if m := s.metrics; m != nil {
		m.resyncs.Inc()
		m.pause.Observe(pause.Seconds())
	}
	s.log.Info("standby attached; resyncing from a snapshot while guests run", "position", snap.At(), "bytes", total, "guest_pause", pause)
	head := Record{Op: OpReset, Result: lg.id, Body: resetBody(total)}
	if err := s.send(l, &head); err != nil {
		return 0, err
	}
	if err := s.streamSnapshot(l, snap); err != nil {
		if errors.Is(err, ErrResyncBudget) || !errors.Is(err, errLink) {
			s.mu.Lock()
			s.restarts++
			s.mu.Unlock()
			s.log.Warn("resync restarts", "err", err)
		}
		return 0, err
	}
	lg.snapshotSent(s.cur)
	took := time.Since(start)
	s.mu.Lock()
	s.lastSnapshot = took
	s.mu.Unlock()
	s.log.Info("resync snapshot sent; the standby catches up from the log", "took", took.Round(time.Millisecond), "position", snap.At())
	return snap.At(), l.Flush()
}

// errLink marks a failure of the link itself while a snapshot streamed.
var errLink = errors.New("replication link")

// streamSnapshot sends the snapshot's records at the configured rate,
// logging progress, until its end; it stops when the log outgrows its
// resync budget. A reader goroutine (readAhead) pulls the records into a
// few large buffers, device memory read straight into the record; they
// are sealed in parts on several workers, out of those buffers into the
// writer's, and written in order (link.BulkWriter): reading the device,
// sealing and the link overlap, and each byte is copied once on the
// primary (the seal is the copy).
func (s *Sender) streamSnapshot(l *link.Conn, snap Snapshot) error {
	bw := l.Bulk()
	free := make(chan []byte, len(s.readAheadBufs))
	for _, b := range s.readAheadBufs {
		free <- b
	}
	ready := make(chan snapshotItem, len(s.readAheadBufs))
	quit, finished := make(chan struct{}), make(chan struct{})
	go func() { readAhead(snap, free, ready, quit); close(finished) }()
	defer func() { close(quit); <-finished }()
	err := s.sendSnapshot(bw, ready, free)
	if werr := bw.Close(); werr != nil && err == nil {
		err = fmt.Errorf("%w: %w", errLink, werr)
	}
	return err
}

// sendSnapshot hands the records read ahead to bw, each buffer back to
// free once written, noting each record's progress as it goes out.
func (s *Sender) sendSnapshot(bw *link.BulkWriter, ready <-chan snapshotItem, free chan<- []byte) error {
	pace := newPacer(s.cfg.ResyncRate)
	lg := s.cfg.Log
	for item := range ready {
		if lg.resyncOverBudget(s.cur) {
			return ErrResyncBudget
		}
		if item.err != nil {
			return fmt.Errorf("reading the snapshot: %w", item.err)
		}
		s.count(len(item.enc))
		err := bw.Record(item.enc, func() {
			free <- item.buf
			lg.streamed(s.cur, item.done, item.total)
			if s.progress.set(item.done) {
				s.log.Info("resync in progress", s.progress.Status().LogArgs()...)
			}
		})
		if err != nil {
			return fmt.Errorf("%w: %w", errLink, err)
		}
		pace.wait(len(item.enc))
		// Guests' requests that are ready to run go first: without this a
		// guest's call could wait behind the stream for a whole scheduler
		// time slice at every step (measured: calls of 40-200 ms).
		runtime.Gosched()
	}
	return nil
}

// resyncChunk is the device memory in one snapshot record: a record pays
// a read of the device and an apply once per 4 MiB (it goes in parts of
// link.PartBytes, sealed and opened on workers), and fits the standby's
// page-locked receive buffers.
const resyncChunk = 4<<20 - recordHeader - link.MacSize - 64

// snapshotItem is a snapshot record read ahead: its encoding (in buf, or
// in a larger buffer of its own), the snapshot's progress after it, or
// the error that ended the reading.
type snapshotItem struct {
	buf, enc    []byte
	done, total uint64
	err         error
}

// newReadAheadBufs makes a sender's snapshot read-ahead buffers, one per
// crypto worker and two more (one read ahead, one on the link), with a
// byte written into every page. A page is not there until first written,
// and the device reading into a fresh one pays for that far more than a
// CPU write does: on the H100 host a 4 MiB device read into a new buffer
// took 3.7 ms, into one already written 0.45 ms, and 6-14 ms inside a
// resync, where the first six reads were 50 ms of a 256 MiB stream's 100.
// Made with the sender, they cost the resync nothing.
func newReadAheadBufs() [][]byte {
	bufs := make([][]byte, link.CryptoWorkers()+2)
	for i := range bufs {
		bufs[i] = bufpool.Touched(make([]byte, 0, recordHeader+resyncChunk))
	}
	return bufs
}

// readAhead pulls snap's records into buffers from free and hands them,
// encoded, to out in order, until the snapshot ends (out is closed), fails
// (the last item carries the error) or quit is closed.
func readAhead(snap Snapshot, free chan []byte, out chan<- snapshotItem, quit <-chan struct{}) {
	defer close(out)
	for {
		var buf []byte
		select {
		case buf = <-free:
		case <-quit:
			return
		}
		rec, ok, err := snap.Next(buf[recordHeader:recordHeader:cap(buf)])
		item := snapshotItem{buf: buf, err: err}
		if err == nil && !ok {
			return
		}
		if err == nil {
			item.enc = encodeAt(buf[:cap(buf)], &rec)
			item.done, item.total = snap.Progress()
		}
		select {
		case out <- item:
		case <-quit:
			return
		}
		if err != nil {
			return
		}
	}
}

// stream sends live records after after until the link or ctx ends, with
// heartbeats while idle and a reader for the standby's acks and answers.
func (s *Sender) stream(ctx context.Context, l *link.Conn, after uint64) error {
	lg := s.cfg.Log
	stop := make(chan struct{})
	readErr := make(chan error, 1)
	go func() { readErr <- s.readAcks(l); close(stop); lg.wake() }()
	go s.heartbeats(l, stop)
	bw := l.Bulk() // large records sealed on workers, written in order
	for {
		recs := lg.next(s.cur, after, stop, batchBytes)
		if recs == nil {
			select {
			case err := <-readErr:
				return err
			default:
			}
			if ctx.Err() != nil {
				return nil
			}
			if lg.Closed() {
				return errors.New("log closed")
			}
			if lg.resyncOverBudget(s.cur) {
				s.mu.Lock()
				s.restarts++
				s.mu.Unlock()
				s.log.Warn("resync restarts: the standby did not catch up within the resync budget")
				return ErrResyncBudget
			}
			// The log dropped records this standby needed: resync.
			return errors.New("standby fell behind what the log holds")
		}
		err := l.Locked(func() error {
			var err error
			after, err = s.sendBacklog(ctx, bw, recs, after, stop)
			if cerr := bw.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			return l.Flush()
		})
		if err != nil {
			return err
		}
	}
}

// sendBacklog queues recs (the records after after) and then whatever
// else the log holds, a batch at a time, until it holds no more or the
// link or ctx ends, and returns the last sequence queued. A record the
// log keeps encoded stays as it is (a standby that reconnects may need
// it again): it is sealed into bw's buffers, a large one on workers (in
// parts above link.PartBytes) while the next is queued, and each batch is
// marked sent once written (the log may then reuse its buffers once
// applied). The link is not drained between batches: draining every 16
// MiB left it idle part of each batch while a standby caught up.
func (s *Sender) sendBacklog(ctx context.Context, bw *link.BulkWriter, recs []entry, after uint64, stop <-chan struct{}) (uint64, error) {
	lg := s.cfg.Log
	for len(recs) > 0 {
		for i := range recs {
			done := func() {}
			if i == len(recs)-1 {
				seq := recs[i].Seq
				done = func() { lg.sentThrough(s.cur, seq) }
			}
			s.count(len(recs[i].enc))
			if err := bw.Record(recs[i].enc, done); err != nil {
				return after, err
			}
			after = recs[i].Seq
		}
		select {
		case <-stop:
			return after, nil
		default:
		}
		if ctx.Err() != nil {
			return after, nil
		}
		recs = lg.ready(s.cur, after, batchBytes)
	}
	return after, nil
}

// batchBytes bounds the records the sender takes from the log at once.
const batchBytes = 16 << 20

// heartbeats tells the standby this primary is alive until stop, so it can
// tell a quiet primary from a dead one.
func (s *Sender) heartbeats(l *link.Conn, stop <-chan struct{}) {
	t := time.NewTicker(heartbeatEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if err := l.WriteFlush(link.MsgHeartbeat, binary.LittleEndian.AppendUint64(make([]byte, 0, 8+link.MacSize), s.node.Term())); err != nil {
			s.heartbeatFailed()
			l.Raw.Close()
			return
		}
	}
}

// heartbeatEvery is how often an idle primary says it is alive.
const heartbeatEvery = 20 * time.Millisecond

// send sends a record that is not in the log (a snapshot's), encoded into
// the link's reused buffer and sealed there.
func (s *Sender) send(l *link.Conn, r *Record) error {
	if cap(l.Plain) < r.Size()+link.MacSize {
		l.Plain = make([]byte, 0, r.Size()+link.MacSize) // room for the seal's tag
	}
	l.Plain = AppendRecord(l.Plain[:0], r)
	s.count(len(l.Plain))
	return l.Write(link.MsgRecord, l.Plain)
}

func (s *Sender) count(n int) {
	s.sent.Add(uint64(n))
	if m := s.metrics; m != nil {
		m.sentBytes.Add(float64(n))
		m.sentOps.Inc()
	}
}

func (s *Sender) readAcks(l *link.Conn) error {
	for {
		l.Raw.SetReadDeadline(time.Now().Add(s.cfg.AckTimeout))
		typ, payload, err := l.Read()
		if err != nil {
			return fmt.Errorf("reading acks: %w", err)
		}
		switch typ {
		case link.MsgAck:
			if len(payload) != 16 {
				return fmt.Errorf("%w: ack of %d bytes", link.ErrCorrupt, len(payload))
			}
			s.acked(binary.LittleEndian.Uint64(payload), binary.LittleEndian.Uint64(payload[8:]))
		case link.MsgFenced:
			return s.fenced(payload)
		case link.MsgVerifyReply:
			id, sums, err := decodeSums(payload)
			if err != nil {
				return err
			}
			s.verifier.Deliver(id, sums)
		case link.MsgReadNeed:
			if len(payload) != 8 {
				return fmt.Errorf("%w: read need of %d bytes", link.ErrCorrupt, len(payload))
			}
			s.cfg.Log.NoteReadNeed(binary.LittleEndian.Uint64(payload))
		default:
			return fmt.Errorf("%w: unexpected message %d from standby", link.ErrCorrupt, typ)
		}
	}
}

// acked records what the standby holds and applied, and notes the end of a
// resync.
func (s *Sender) acked(received, applied uint64) {
	s.cfg.Log.ack(s.cur, received, applied)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.resyncing && s.cfg.Log.peerStatus(s.cur).Protected {
		s.resyncing = false
		s.lastResync = time.Since(s.resyncFrom)
		s.lastResyncBytes = s.sent.Load() - s.resyncSent
		s.log.Info("standby resynced; primary is protected", "took", s.lastResync)
	}
}

// fenced handles the standby's answer that it was promoted: the node is
// told, and the link ends.
func (s *Sender) fenced(payload []byte) error {
	if len(payload) != 8 {
		return fmt.Errorf("%w: fence of %d bytes", link.ErrCorrupt, len(payload))
	}
	term := binary.LittleEndian.Uint64(payload)
	s.mu.Lock()
	if s.handover != nil {
		s.handover <- term
		s.handover = nil
	}
	s.mu.Unlock()
	own := s.node.Term()
	s.node.PeerTerm(term)
	if term > own {
		s.log.Warn("the standby answers that it was promoted under a newer term", "term", term)
		return fmt.Errorf("fenced by term %d: the node at %s was promoted and serves in this primary's place", term, s.cfg.Addr)
	}
	// A fenced node at or below this node's term is a deposed primary
	// (once promoted itself) still holding the address this node streams
	// to: it needs restarting as a standby.
	return fmt.Errorf("the node at %s was deposed (it answers fenced, term %d; this primary serves under term %d) and takes no stream; "+
		"restart it as this node's standby: vgpuha standby --listen tcp://%s ... (docs/OPERATIONS.md, Fail-back)", s.cfg.Addr, term, own, s.cfg.Addr)
}

// refusedBy handles the standby's refusal of this primary: counted and
// returned (Run logs it); one for a term below the standby's tells the
// node that term, whose authority fences a primary under it.
func (s *Sender) refusedBy(payload []byte, self admission.Identity) error {
	reason, follows, err := decodeRefusal(payload)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.refused[reason]++
	s.mu.Unlock()
	if m := s.metrics; m != nil {
		m.refused.WithLabelValues(reason.String()).Inc()
	}
	if reason == admission.RefusedStaleTerm {
		s.node.PeerTerm(follows.Term)
	}
	return &admission.RefusedError{Reason: reason, Follows: follows, Self: self}
}

// Handover asks the standby to take over now (a planned switchover) and
// returns its new term. The caller must have stopped every guest and made
// sure the standby applied the whole log.
func (s *Sender) Handover(timeout time.Duration) (uint64, error) {
	ch := make(chan uint64, 1)
	s.mu.Lock()
	l := s.link
	if l == nil {
		s.mu.Unlock()
		return 0, fmt.Errorf("no standby attached")
	}
	s.handover = ch
	s.mu.Unlock()
	if err := l.WriteFlush(link.MsgPromote, make([]byte, 0, link.MacSize)); err != nil {
		return 0, err
	}
	select {
	case term := <-ch:
		return term, nil
	case <-time.After(timeout):
		return 0, fmt.Errorf("the standby did not take over within %v", timeout)
	}
}

func (s *Sender) heartbeatFailed() {
	if m := s.metrics; m != nil {
		m.heartbeatFailures.Inc()
	}
}
