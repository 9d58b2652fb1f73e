package replicate

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"
)

// Applier applies records to the replica. The standby implements it.
type Applier interface {
	// Apply applies one record, deterministically (like raft's FSM.Apply):
	// the same records in the same order always give the same replica. An
	// error means the replica could not do what the primary did; the
	// applier keeps the divergence for status and verify, and the stream
	// goes on.
	Apply(r *Record) error
	// Checksums describes every replica object for verify.
	Checksums() []ObjectSum
}

// ReceiverConfig configures the standby's end of the link.
type ReceiverConfig struct {
	Key     []byte
	Applier Applier
	Log     *slog.Logger
	// AckInterval bounds how long an applied record waits to be
	// acknowledged; acks also go out whenever the stream pauses.
	AckInterval time.Duration
	// Observe, when set, receives each record's apply time.
	Observe func(op Op, d time.Duration)
	// HostBuffer, when set, allocates the buffer records are received into
	// (see gpu.HostAllocator).
	HostBuffer func(n int) []byte
	// OnHeard, when set, is called whenever anything arrives from the
	// primary: the failure detector's heartbeat.
	OnHeard func()
	// OnPromote, when set, is called (on its own goroutine) after the
	// primary handed over in a planned switchover; the receiver is fenced
	// under term by then.
	OnPromote func(term uint64)
}

// ReceiverStatus is the standby's view of replication.
type ReceiverStatus struct {
	Connected       bool   `json:"connected"`
	Primary         string `json:"primary,omitempty"`
	Mode            string `json:"mode"`
	Applied         uint64 `json:"applied_seq"`
	Resyncing       bool   `json:"resyncing"`
	SnapshotRecords uint64 `json:"snapshot_records_applied"`
	EpochBuffered   int    `json:"epoch_buffered_records"`
	ApplyErrors     uint64 `json:"apply_errors"`
	RefusedPeers    uint64 `json:"refused_peers"`
	// Term is the highest term seen on the stream (or this node's own,
	// once promoted); Fenced means it no longer takes a stream.
	Term   uint64 `json:"term"`
	Fenced bool   `json:"fenced"`
	// InSync: a snapshot or resume completed and records stream live, so
	// the replica is a complete copy up to Applied.
	InSync bool `json:"in_sync"`
}

// Receiver accepts the primary's stream and applies it.
type Receiver struct {
	cfg ReceiverConfig

	linkMu sync.Mutex // one link applies at a time

	mu        sync.Mutex
	logID     uint64
	applied   uint64
	mode      Mode
	epochBuf  []Record
	st        ReceiverStatus
	current   net.Conn
	listeners []net.Listener
}

// NewReceiver returns a receiver.
func NewReceiver(cfg ReceiverConfig) (*Receiver, error) {
	if len(cfg.Key) < MinKeyBytes {
		return nil, fmt.Errorf("replication key must be at least %d bytes", MinKeyBytes)
	}
	if cfg.AckInterval == 0 {
		cfg.AckInterval = 100 * time.Millisecond
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Receiver{cfg: cfg}, nil
}

// Status reports the receiver's state.
func (r *Receiver) Status() ReceiverStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.st
	st.Applied, st.Mode, st.EpochBuffered = r.applied, r.mode.String(), len(r.epochBuf)
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

func (r *Receiver) serveConn(c net.Conn) {
	defer c.Close()
	log := r.cfg.Log.With("primary", c.RemoteAddr().String())
	l, err := serverHandshake(c, r.cfg.Key, 5*time.Second)
	if err != nil {
		r.mu.Lock()
		r.st.RefusedPeers++
		r.mu.Unlock()
		log.Warn("refused replication peer", "err", err)
		return
	}
	l.alloc = r.cfg.HostBuffer
	// Take over from any previous link (the primary reconnected).
	r.mu.Lock()
	if r.current != nil {
		r.current.Close()
	}
	r.current = c
	r.mu.Unlock()
	r.linkMu.Lock()
	defer r.linkMu.Unlock()
	r.mu.Lock()
	if r.current != c { // replaced while waiting
		r.mu.Unlock()
		return
	}
	if r.st.Fenced {
		term := r.st.Term
		r.mu.Unlock()
		l.write(msgFenced, binary.LittleEndian.AppendUint64(make([]byte, 0, 8+macSize), term))
		l.flush()
		log.Warn("refused a primary's stream: this node was promoted", "term", term)
		return
	}
	r.st.Connected, r.st.Primary = true, c.RemoteAddr().String()
	state := binary.LittleEndian.AppendUint64(nil, r.logID)
	state = binary.LittleEndian.AppendUint64(state, r.applied)
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		if r.current == c {
			r.current = nil
			r.st.Connected = false
		}
		r.mu.Unlock()
	}()

	var wmu sync.Mutex
	writeFlush := func(typ uint16, payload []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		if err := l.write(typ, payload); err != nil {
			return err
		}
		return l.flush()
	}
	if err := writeFlush(msgState, state); err != nil {
		return
	}
	done := make(chan struct{})
	defer close(done)
	kick := make(chan struct{}, 1)
	go func() { // acks: whenever the stream pauses, and at least every AckInterval
		t := time.NewTicker(r.cfg.AckInterval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			case <-kick:
			}
			r.mu.Lock()
			seq := r.applied
			r.mu.Unlock()
			if writeFlush(msgAck, binary.LittleEndian.AppendUint64(nil, seq)) != nil {
				c.Close()
				return
			}
		}
	}()

	for {
		typ, payload, err := l.read()
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				log.Warn("replication link lost", "err", err)
			}
			return
		}
		if r.cfg.OnHeard != nil {
			r.cfg.OnHeard()
		}
		switch typ {
		case msgPromote:
			// A planned switchover: the primary has stopped its guests and
			// waited for us to apply everything. Take over, if this node
			// can serve guests at all.
			r.mu.Lock()
			if r.cfg.OnPromote == nil {
				r.mu.Unlock()
				log.Error("switchover refused: this standby has no guest endpoint to take over on")
				continue
			}
			term := r.st.Term + 1
			r.st.Fenced, r.st.Term = true, term
			r.mu.Unlock()
			writeFlush(msgFenced, binary.LittleEndian.AppendUint64(make([]byte, 0, 8+macSize), term))
			log.Info("switchover: the primary handed over", "term", term)
			r.mu.Lock()
			onPromote := r.cfg.OnPromote
			r.mu.Unlock()
			go onPromote(term)
			return
		case msgHeartbeat:
			if len(payload) == 8 {
				r.noteTerm(binary.LittleEndian.Uint64(payload))
			}
		case msgMode:
			if len(payload) != 16 {
				log.Warn("bad mode message; dropping link")
				return
			}
			r.mu.Lock()
			r.mode = Mode(binary.LittleEndian.Uint64(payload))
			r.mu.Unlock()
			// Known before any record: a standby that takes over must
			// always do so under a term above the primary's.
			r.noteTerm(binary.LittleEndian.Uint64(payload[8:]))
		case msgRecord:
			rec, err := DecodeRecord(payload)
			if err != nil {
				log.Warn("dropping link", "err", err)
				return
			}
			r.noteTerm(rec.Term)
			reply, err := r.handle(&rec)
			if err != nil {
				log.Warn("dropping link", "err", err)
				return
			}
			if reply != nil && writeFlush(msgVerifyReply, reply) != nil {
				return
			}
		default:
			log.Warn("unexpected message from primary; dropping link", "type", typ)
			return
		}
		if l.r.Buffered() == 0 {
			select {
			case kick <- struct{}{}:
			default:
			}
		}
	}
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
		r.apply(rec)
		r.mu.Lock()
		r.logID, r.applied, r.epochBuf = rec.Result, 0, nil
		r.st.Resyncing, r.st.SnapshotRecords, r.st.InSync = true, 0, false
		r.mu.Unlock()
		r.cfg.Log.Info("resync started: replica reset")
		return nil, nil
	case rec.Seq == 0: // part of a snapshot
		if rec.Op == OpSnapshotEnd {
			r.mu.Lock()
			r.applied, r.st.Resyncing, r.st.InSync = rec.Result, false, true
			n := r.st.SnapshotRecords
			r.mu.Unlock()
			r.cfg.Log.Info("resync snapshot applied; streaming live", "records", n, "position", rec.Result)
			return nil, nil
		}
		r.apply(rec)
		r.mu.Lock()
		r.st.SnapshotRecords++
		n := r.st.SnapshotRecords
		r.mu.Unlock()
		if n%1000 == 0 {
			r.cfg.Log.Info("resync in progress", "snapshot_records", n)
		}
		return nil, nil
	case rec.Seq != applied+1:
		return nil, fmt.Errorf("record %d after %d: the stream has a gap", rec.Seq, applied)
	}
	var reply []byte
	switch {
	case rec.Op == OpVerify:
		reply = encodeSums(rec.Result, r.cfg.Applier.Checksums())
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

func (r *Receiver) apply(rec *Record) {
	start := time.Now()
	err := r.cfg.Applier.Apply(rec)
	if r.cfg.Observe != nil {
		r.cfg.Observe(rec.Op, time.Since(start))
	}
	if err != nil {
		r.mu.Lock()
		r.st.ApplyErrors++
		r.mu.Unlock()
		r.cfg.Log.Warn("replica diverged", "seq", rec.Seq, "session", rec.Session, "op", rec.Op, "err", err)
	}
}

func (r *Receiver) noteTerm(t uint64) {
	r.mu.Lock()
	if t > r.st.Term && !r.st.Fenced {
		r.st.Term = t
	}
	r.mu.Unlock()
}

// Fence makes this receiver stop applying for good (its node was promoted
// under term): the current link is dropped, and a primary that connects
// later is told the term so it stops serving.
func (r *Receiver) Fence(term uint64) {
	r.mu.Lock()
	r.st.Fenced, r.st.Term = true, max(term, r.st.Term)
	if r.current != nil {
		r.current.Close()
	}
	r.mu.Unlock()
	r.linkMu.Lock() // wait for the link's goroutine to stop applying
	r.linkMu.Unlock()
}

// SetOnPromote installs the switchover hook (see ReceiverConfig.OnPromote).
func (r *Receiver) SetOnPromote(fn func(term uint64)) {
	r.mu.Lock()
	r.cfg.OnPromote = fn
	r.mu.Unlock()
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
