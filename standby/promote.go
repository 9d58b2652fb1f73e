package standby

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/vgpuha/vgpuha/failover"
	"github.com/vgpuha/vgpuha/pvdriver/transport"
	"github.com/vgpuha/vgpuha/replicate"
)

// PromoteConfig says when and how this standby takes over.
type PromoteConfig struct {
	// GuestListen is where the promoted node serves guests (they resume
	// their sessions there).
	GuestListen string
	Detector    failover.Detector
	// Now is the clock (time.Now in production).
	Now func() time.Time
	// ReplicateTo, when set, is the next standby (host:port) this node
	// protects itself with once promoted, in Mode, with Key.
	ReplicateTo string
	Mode        replicate.Mode
	Key         []byte
}

// Promotion records one takeover.
type Promotion struct {
	Term           uint64    `json:"term"`
	LastHeard      time.Time `json:"last_heard"`
	Detected       time.Time `json:"detected"`
	Serving        time.Time `json:"serving"`
	DetectionMS    float64   `json:"detection_ms"` // silence before the detector fired
	PromotionMS    float64   `json:"promotion_ms"` // detection to serving guests
	DiscardedEpoch int       `json:"discarded_epoch_records"`
}

type watcher struct {
	mu        sync.Mutex
	node      *failover.Node // the role logic; nil until Watch
	lastHeard time.Time
	promoted  *Promotion
}

// heard feeds the detector; the receiver calls it for every frame.
func (a *Agent) heard() {
	now := a.now()
	a.w.mu.Lock()
	a.w.lastHeard = now
	if a.w.node != nil {
		a.w.node.Heard(now, 0)
	}
	a.w.mu.Unlock()
}

func (a *Agent) now() time.Time {
	a.w.mu.Lock()
	clock := a.pcfg.Now
	a.w.mu.Unlock()
	if clock != nil {
		return clock()
	}
	return time.Now()
}

// Watch runs the failure detector until ctx ends or the node is promoted.
// It arms only once the replica is in sync: a standby that never held a
// complete copy must not take over.
func (a *Agent) Watch(ctx context.Context, cfg PromoteConfig) {
	a.w.mu.Lock()
	a.pcfg = cfg
	a.w.node = failover.NewStandby(cfg.Detector)
	a.w.mu.Unlock()
	a.Receiver.SetOnPromote(func(term uint64) {
		a.w.mu.Lock()
		last := a.w.lastHeard
		a.w.node.HandOver()
		a.w.mu.Unlock()
		if err := a.Promote(term, last, a.now()); err != nil {
			a.log.Error("switchover promotion failed", "err", err)
		}
	})
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st := a.Receiver.Status()
		if st.Fenced {
			return // taken over by a switchover
		}
		now := a.now()
		a.w.mu.Lock()
		n := a.w.node
		n.InSync = st.InSync
		n.Term = max(n.Term, st.Term)
		takeOver := n.Tick(now) // the golden-tested decision (failover/testdata/roles)
		term, last := n.Term, a.w.lastHeard
		a.w.mu.Unlock()
		if takeOver {
			if err := a.Promote(term, last, now); err != nil {
				a.log.Error("promotion failed", "err", err)
			}
			return
		}
	}
}

// Promote makes this standby the primary under term: it stops taking the
// old primary's stream (and tells it so if it comes back), drops an
// uncommitted epoch, and serves guests on the configured endpoint with
// every session, handle and device address intact.
func (a *Agent) Promote(term uint64, lastHeard, detected time.Time) error {
	st := a.Receiver.Status()
	if !st.Fenced { // a failure; a switchover fenced the receiver already
		a.Receiver.Fence(term)
	}
	dropped := a.Receiver.DiscardEpoch()
	a.Server.SetTerm(term)
	a.w.mu.Lock()
	endpoint, cfg := a.pcfg.GuestListen, a.pcfg
	a.w.mu.Unlock()
	if cfg.ReplicateTo != "" {
		if err := a.reprotect(cfg); err != nil {
			a.log.Error("cannot replicate to the next standby; serving unprotected", "err", err)
		}
	}
	ln, err := transport.Listen(endpoint)
	if err != nil {
		return fmt.Errorf("serving guests after promotion: %w", err)
	}
	go a.Server.Serve(ln)
	p := &Promotion{Term: term, LastHeard: lastHeard, Detected: detected, Serving: a.now(), DiscardedEpoch: dropped}
	p.DetectionMS = float64(detected.Sub(lastHeard).Microseconds()) / 1000
	p.PromotionMS = float64(p.Serving.Sub(detected).Microseconds()) / 1000
	a.w.mu.Lock()
	a.w.promoted = p
	a.w.mu.Unlock()
	a.promotions.Inc()
	a.log.Warn("promoted to primary", "term", term, "silence_ms", p.DetectionMS, "promotion_ms", p.PromotionMS,
		"guest_endpoint", endpoint, "applied_seq", st.Applied, "discarded_epoch_records", dropped)
	return nil
}

// Promoted returns the takeover, if there was one.
func (a *Agent) Promoted() *Promotion {
	a.w.mu.Lock()
	defer a.w.mu.Unlock()
	return a.w.promoted
}

// reprotect makes the promoted node replicate to the next standby before it
// serves any guest; the standby is brought up to date from a snapshot.
func (a *Agent) reprotect(cfg PromoteConfig) error {
	log := replicate.NewLog(256 << 20)
	a.Server.Replicate(log, cfg.Mode)
	sender, err := replicate.NewSender(replicate.SenderConfig{
		Addr: cfg.ReplicateTo, Key: cfg.Key, Mode: cfg.Mode, Log: log, Log_: a.log,
		Snapshot: a.Server.Snapshot, Term: a.Server.Term, OnFenced: a.Server.Fence,
	})
	if err != nil {
		return err
	}
	a.w.mu.Lock()
	a.sender = sender
	a.w.mu.Unlock()
	go sender.Run(context.Background())
	a.log.Info("promoted node replicates to the next standby", "standby", cfg.ReplicateTo, "mode", cfg.Mode)
	return nil
}
