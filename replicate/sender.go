package replicate

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"
)

// SenderConfig configures the primary's end of the replication link.
type SenderConfig struct {
	Addr string // standby's host:port
	Key  []byte // pre-shared key, at least MinKeyBytes
	Mode Mode
	Log  *Log
	// Snapshot builds a resync snapshot: with every session stopped it
	// calls Log.BeginSnapshot and returns records (Seq 0, FlagPlaced) that
	// rebuild the current state. It reports how long guests were stopped.
	Snapshot func() ([]Record, time.Duration)
	// OnVerify receives the standby's checksums for a verification.
	OnVerify func(id uint64, sums []ObjectSum)
	// OnFenced is called when the standby answers that it was promoted
	// under a newer term: this primary must stop serving guests.
	OnFenced func(term uint64)
	// Term is the term stamped on heartbeats.
	Term func() uint64
	Log_ *slog.Logger
	// AckTimeout: a standby silent this long is dropped (it sends an ack at
	// least every AckInterval).
	AckTimeout time.Duration
	Metrics    *Metrics
}

// SenderStatus is the primary's view of replication.
type SenderStatus struct {
	State       string  `json:"state"` // unprotected, resyncing, protected
	Mode        string  `json:"mode"`
	Standby     string  `json:"standby"`
	Resyncs     uint64  `json:"resyncs"`
	LastPauseMS float64 `json:"last_resync_pause_ms"`
	LastResync  float64 `json:"last_resync_seconds"`
	LastError   string  `json:"last_error,omitempty"`
	LogStatus
}

// Sender streams the log to the standby, reconnecting and resyncing as
// needed.
type Sender struct {
	cfg SenderConfig
	log *slog.Logger

	mu         sync.Mutex
	resyncs    uint64
	lastPause  time.Duration
	lastResync time.Duration
	lastErr    string
	handover   chan uint64 // a switchover waiting for the standby's term
	link       *link
	linkMu     *sync.Mutex
	resyncing  bool
	resyncFrom time.Time
	ticker     *time.Ticker
}

// NewSender returns a sender; Run starts it.
func NewSender(cfg SenderConfig) (*Sender, error) {
	if len(cfg.Key) < MinKeyBytes {
		return nil, fmt.Errorf("replication key must be at least %d bytes", MinKeyBytes)
	}
	if cfg.AckTimeout == 0 {
		cfg.AckTimeout = 3 * time.Second
	}
	if cfg.Log_ == nil {
		cfg.Log_ = slog.Default()
	}
	return &Sender{cfg: cfg, log: cfg.Log_.With("standby", cfg.Addr)}, nil
}

// SetMetrics attaches metrics; call before Run.
func (s *Sender) SetMetrics(m *Metrics) { s.cfg.Metrics = m }

// Run connects and streams until ctx ends. Heartbeats also go out as UDP
// datagrams to the same address (see heartbeat.go).
func (s *Sender) Run(ctx context.Context) {
	term := s.cfg.Term
	if term == nil {
		term = func() uint64 { return 0 }
	}
	go SendUDPHeartbeats(ctx, s.cfg.Addr, s.cfg.Key, term, heartbeatEvery, s.heartbeatFailed)
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		err := s.session(ctx)
		s.cfg.Log.attach(false, 0, false)
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
	ls := s.cfg.Log.Status()
	s.mu.Lock()
	defer s.mu.Unlock()
	st := SenderStatus{Mode: s.cfg.Mode.String(), Standby: s.cfg.Addr, Resyncs: s.resyncs,
		LastPauseMS: float64(s.lastPause.Microseconds()) / 1000, LastResync: s.lastResync.Seconds(),
		LastError: s.lastErr, LogStatus: ls, State: "unprotected"}
	switch {
	case ls.Protected:
		st.State = "protected"
	case ls.Attached:
		st.State = "resyncing"
	}
	return st
}

func (s *Sender) session(ctx context.Context) error {
	d := net.Dialer{Timeout: 2 * time.Second}
	c, err := d.DialContext(ctx, "tcp", s.cfg.Addr)
	if err != nil {
		return err
	}
	defer c.Close()
	c.(*net.TCPConn).SetNoDelay(true)
	l, err := clientHandshake(c, s.cfg.Key, 5*time.Second)
	if err != nil {
		return err
	}
	c.SetReadDeadline(time.Now().Add(s.cfg.AckTimeout))
	typ, payload, err := l.read()
	if err != nil {
		return fmt.Errorf("reading standby state: %w", err)
	}
	if typ == msgFenced {
		return s.fenced(payload)
	}
	if typ != msgState || len(payload) != 16 {
		return fmt.Errorf("%w: expected standby state", ErrCorrupt)
	}
	logID, applied := binary.LittleEndian.Uint64(payload), binary.LittleEndian.Uint64(payload[8:])

	var term uint64
	if s.cfg.Term != nil {
		term = s.cfg.Term()
	}
	mode := binary.LittleEndian.AppendUint64(make([]byte, 0, 16+macSize), uint64(s.cfg.Mode))
	if err := l.write(msgMode, binary.LittleEndian.AppendUint64(mode, term)); err != nil {
		return err
	}
	var wmu sync.Mutex // from the heartbeat goroutine's start, both it and this one write
	s.mu.Lock()
	s.link, s.linkMu = l, &wmu
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.link, s.linkMu = nil, nil
		s.mu.Unlock()
	}()
	lg := s.cfg.Log
	lg.mu.Lock()
	resume := logID == lg.id && lg.canResume(applied)
	lg.mu.Unlock()

	var after uint64
	if resume {
		lg.attach(true, applied, false)
		after = applied
		s.log.Info("standby attached; catching up from the log", "applied", applied)
	} else {
		lg.attach(true, 0, true)
		start := time.Now()
		recs, pause := s.cfg.Snapshot()
		s.mu.Lock()
		s.resyncs++
		s.lastPause = pause
		s.resyncing, s.resyncFrom = true, start
		s.mu.Unlock()
		if s.cfg.Metrics != nil {
			s.cfg.Metrics.resyncs.Inc()
			s.cfg.Metrics.pause.Observe(pause.Seconds())
		}
		s.log.Info("standby attached; resyncing from a snapshot", "records", len(recs), "guest_pause", pause)
		head := Record{Op: OpReset, Result: lg.id}
		if err := s.send(l, &head); err != nil {
			return err
		}
		for i := range recs {
			if err := s.send(l, &recs[i]); err != nil {
				return err
			}
			if recs[i].Op == OpSnapshotEnd {
				after = recs[i].Result
			}
		}
		if err := l.flush(); err != nil {
			return err
		}
	}

	if err := l.flush(); err != nil {
		return err
	}
	stop := make(chan struct{})
	readErr := make(chan error, 1)
	go func() { readErr <- s.readAcks(c, l); close(stop); lg.wake() }()
	go func() { // heartbeats, so the standby can tell a quiet primary from a dead one
		t := time.NewTicker(heartbeatEvery)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			var term uint64
			if s.cfg.Term != nil {
				term = s.cfg.Term()
			}
			wmu.Lock()
			err := l.write(msgHeartbeat, binary.LittleEndian.AppendUint64(make([]byte, 0, 8+macSize), term))
			if err == nil {
				err = l.flush()
			}
			wmu.Unlock()
			if err != nil {
				s.heartbeatFailed()
				c.Close()
				return
			}
		}
	}()
	for {
		recs := lg.next(after, stop)
		if recs == nil {
			select {
			case err := <-readErr:
				return err
			default:
			}
			if ctx.Err() != nil {
				return nil
			}
			if lg.isClosed() {
				return errors.New("log closed")
			}
			// The log dropped records this standby needed: resync.
			return errors.New("standby fell behind what the log holds")
		}
		wmu.Lock()
		err := func() error {
			for i := range recs {
				if err := s.send(l, &recs[i]); err != nil {
					return err
				}
				after = recs[i].Seq
			}
			return l.flush()
		}()
		wmu.Unlock()
		if err != nil {
			return err
		}
	}
}

// heartbeatEvery is how often an idle primary says it is alive.
const heartbeatEvery = 50 * time.Millisecond

func (s *Sender) send(l *link, r *Record) error {
	buf := AppendRecord(make([]byte, 0, r.Size()+macSize), r) // room for the seal's tag
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.sentBytes.Add(float64(len(buf)))
		s.cfg.Metrics.sentOps.Inc()
	}
	return l.write(msgRecord, buf)
}

func (s *Sender) readAcks(c net.Conn, l *link) error {
	for {
		c.SetReadDeadline(time.Now().Add(s.cfg.AckTimeout))
		typ, payload, err := l.read()
		if err != nil {
			return fmt.Errorf("reading acks: %w", err)
		}
		switch typ {
		case msgAck:
			if len(payload) != 8 {
				return fmt.Errorf("%w: ack of %d bytes", ErrCorrupt, len(payload))
			}
			seq := binary.LittleEndian.Uint64(payload)
			s.cfg.Log.ack(seq)
			s.mu.Lock()
			if s.resyncing && s.cfg.Log.Status().Protected {
				s.resyncing = false
				s.lastResync = time.Since(s.resyncFrom)
				s.log.Info("standby resynced; primary is protected", "took", s.lastResync)
			}
			s.mu.Unlock()
		case msgFenced:
			return s.fenced(payload)
		case msgVerifyReply:
			id, sums, err := decodeSums(payload)
			if err != nil {
				return err
			}
			if s.cfg.OnVerify != nil {
				s.cfg.OnVerify(id, sums)
			}
		default:
			return fmt.Errorf("%w: unexpected message %d from standby", ErrCorrupt, typ)
		}
	}
}

// fenced handles the standby's answer that it was promoted: this primary
// must stop serving guests.
func (s *Sender) fenced(payload []byte) error {
	if len(payload) != 8 {
		return fmt.Errorf("%w: fence of %d bytes", ErrCorrupt, len(payload))
	}
	term := binary.LittleEndian.Uint64(payload)
	s.mu.Lock()
	if s.handover != nil {
		s.handover <- term
		s.handover = nil
	}
	s.mu.Unlock()
	s.log.Warn("the standby was promoted under a newer term; this primary is fenced", "term", term)
	if s.cfg.OnFenced != nil {
		s.cfg.OnFenced(term)
	}
	return fmt.Errorf("fenced by term %d", term)
}

// Handover asks the standby to take over now (a planned switchover) and
// returns its new term. The caller must have stopped every guest and made
// sure the standby applied the whole log.
func (s *Sender) Handover(timeout time.Duration) (uint64, error) {
	ch := make(chan uint64, 1)
	s.mu.Lock()
	l, wmu := s.link, s.linkMu
	if l == nil {
		s.mu.Unlock()
		return 0, fmt.Errorf("no standby attached")
	}
	s.handover = ch
	s.mu.Unlock()
	wmu.Lock()
	err := l.write(msgPromote, make([]byte, 0, macSize))
	if err == nil {
		err = l.flush()
	}
	wmu.Unlock()
	if err != nil {
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
	if m := s.cfg.Metrics; m != nil {
		m.heartbeatFailures.Inc()
	}
}
