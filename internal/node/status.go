package node

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/failover"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/internal/admin"
	"github.com/vgpuha/vgpuha/replicate"
	"github.com/vgpuha/vgpuha/replicate/receiver"
)

// Status is a node's /status: one shape for every role (a first primary,
// a standby, a promoted standby, a fenced node), every key always present.
// Units are seconds and bytes; names follow the Prometheus series they
// mirror (docs/STATUS.md lists each field's series).
type Status struct {
	// Role is failover.Role's name: primary, standby, suspended or fenced.
	Role string `json:"role"`
	// Term is the newest term this node knows (vgpuha_term on a serving
	// node); a fenced node's is the term that fenced it.
	Term uint64 `json:"term"`
	// Serving: guests are served here now (vgpuha_is_primary).
	Serving bool   `json:"serving"`
	Backend string `json:"backend"`
	// GPUs are the GPUs the node serves, each with the sessions placed
	// on it and their memory (vgpuha_gpu_* by index); each session names
	// its GPU.
	GPUs     []hypervisor.GPUStatus     `json:"gpus"`
	Sessions []hypervisor.SessionStatus `json:"sessions"`
	// DetachedSessions are sessions no connection serves (kept for a
	// resume, or a standby's replicas).
	DetachedSessions  int    `json:"detached_sessions"`
	DeviceObjects     int    `json:"device_objects"`
	DeviceMemoryBytes uint64 `json:"device_memory_bytes"`
	// Tenancy: the device memory each tenant's sessions hold, and the
	// device's (hypervisor/tenancy).
	Tenancy     hypervisor.TenancyStatus `json:"tenancy"`
	Replication Replication              `json:"replication"`
	// Promotion is this node's takeover (null if it never took over).
	Promotion *PromotionStatus `json:"promotion"`
}

// Replication directions.
const (
	ToStandby   = "to_standby"   // this node streams its log to Peer (a primary)
	FromPrimary = "from_primary" // this node applies Peer's stream (a standby)
	NoPeer      = "none"         // neither: a primary without --replicate-to
)

// Replication is the node's replication, in either direction: a
// primary's log and its standbys (each in Standbys), or a standby's
// stream from its primary.
type Replication struct {
	Direction string `json:"direction"`
	// Peer is the standbys' addresses, comma-separated in priority order
	// (to_standby), or the connected primary's (from_primary).
	Peer string `json:"peer"`
	// State: to_standby: unprotected, resyncing, degraded (fewer than
	// MinInSync standbys in the sync set) or protected; from_primary:
	// disconnected, resyncing, catching_up or in_sync; none: off.
	State     string `json:"state"`
	Mode      string `json:"mode"`
	Connected bool   `json:"connected"`
	// InSync: the replica is a complete copy up to AppliedSequence
	// (to_standby: MinInSync standbys are in sync).
	InSync bool `json:"in_sync"`
	// Protected: MinInSync caught-up standbys hold every acknowledged op
	// (to_standby only).
	Protected bool `json:"protected"`
	// MinInSync is k (to_standby; 0 on a standby); InSyncStandbys how
	// many standbys are in sync now (vgpuha_replication_in_sync_standbys).
	MinInSync      int `json:"min_in_sync"`
	InSyncStandbys int `json:"in_sync_standbys"`
	// Standbys: each standby this primary streams to (empty on a
	// standby).
	Standbys []StandbyLink `json:"standbys"`
	// LastSequence is the newest record logged (to_standby) or received
	// (from_primary); AppliedSequence the last one the replica applied.
	LastSequence    uint64  `json:"last_sequence"`
	AppliedSequence uint64  `json:"applied_sequence"`
	LagRecords      uint64  `json:"lag_records"`
	LagBytes        int64   `json:"lag_bytes"`
	LagSeconds      float64 `json:"lag_seconds"`
	// HeartbeatAgeSeconds: time since the primary was last heard
	// (from_primary; null before it was heard, and on a primary).
	HeartbeatAgeSeconds    *float64 `json:"heartbeat_age_seconds"`
	Epoch                  uint64   `json:"epoch"`
	ResyncsTotal           uint64   `json:"resyncs_total"`
	ResyncRestartsTotal    uint64   `json:"resync_restarts_total"`
	LastResyncPauseSeconds float64  `json:"last_resync_pause_seconds"`
	LastResyncSeconds      float64  `json:"last_resync_seconds"`
	LastResyncBytes        uint64   `json:"last_resync_bytes"`
	LastResyncSnapshot     float64  `json:"last_resync_snapshot_seconds"`
	ApplyErrorsTotal       uint64   `json:"apply_errors_total"`
	// RefusedPeersTotal: on a standby, the primaries it refused; on a
	// primary, its standbys' refusals of it. RefusedPeers by reason.
	RefusedPeersTotal uint64       `json:"refused_peers_total"`
	RefusedPeers      RefusedPeers `json:"refused_peers"`
	// Group and PrimaryID: the pair's group and the primary's id, this
	// node's own (to_standby) or the primary's it follows (from_primary;
	// "" before it followed one). Package replicate/admission says what they
	// mean.
	Group     string `json:"group"`
	PrimaryID string `json:"primary_id"`
	LastError string `json:"last_error"`
	// Resync is the resync under way (null when none runs).
	Resync *Resync `json:"resync"`
}

// RefusedPeers counts refused replication links by reason
// (admission.RefuseReason; vgpuha_standby_refused_peers_total and
// vgpuha_replication_refused_peers_total carry it as the reason label).
type RefusedPeers struct {
	Auth         uint64 `json:"auth"`
	Fenced       uint64 `json:"fenced"`
	StaleTerm    uint64 `json:"stale_term"`
	OtherGroup   uint64 `json:"other_group"`
	OtherPrimary uint64 `json:"other_primary"`
	Rewound      uint64 `json:"rewound"`
}

// add adds counts by reason name.
func (r *RefusedPeers) add(byReason map[string]uint64) {
	fields := map[string]*uint64{"auth": &r.Auth, "fenced": &r.Fenced, "stale_term": &r.StaleTerm,
		"other_group": &r.OtherGroup, "other_primary": &r.OtherPrimary, "rewound": &r.Rewound}
	for name, n := range byReason {
		if f := fields[name]; f != nil {
			*f += n
		}
	}
}

// StandbyLink is a primary's link to one of its standbys (the series are
// labelled standby=Peer).
type StandbyLink struct {
	Peer string `json:"peer"`
	// State: unprotected (not connected), resyncing, protected.
	State     string `json:"state"`
	Connected bool   `json:"connected"`
	// InSync: in the sync set and holding every acknowledged op (the
	// group's record names it in sync: it may take over).
	InSync              bool    `json:"in_sync"`
	Protected           bool    `json:"protected"`
	AppliedSequence     uint64  `json:"applied_sequence"`
	LagRecords          uint64  `json:"lag_records"`
	LagBytes            int64   `json:"lag_bytes"`
	LagSeconds          float64 `json:"lag_seconds"`
	ResyncsTotal        uint64  `json:"resyncs_total"`
	ResyncRestartsTotal uint64  `json:"resync_restarts_total"`
	// RefusedPeersTotal: times this standby refused this primary.
	RefusedPeersTotal uint64 `json:"refused_peers_total"`
	LastError         string `json:"last_error"`
}

// Resync is a resync's progress in snapshot contents bytes.
type Resync struct {
	BytesDone          uint64  `json:"bytes_done"`
	BytesTotal         uint64  `json:"bytes_total"`
	RateBytesPerSecond float64 `json:"rate_bytes_per_second"`
	ETASeconds         float64 `json:"eta_seconds"`
}

// PromotionStatus is a Promotion in seconds.
type PromotionStatus struct {
	Term      uint64    `json:"term"`
	LastHeard time.Time `json:"last_heard"`
	Detected  time.Time `json:"detected"`
	Serving   time.Time `json:"serving"`
	// DetectionSeconds: silence before the detector fired
	// (vgpuha_last_detection_seconds); PromotionSeconds: detection to
	// serving guests.
	DetectionSeconds      float64 `json:"detection_seconds"`
	PromotionSeconds      float64 `json:"promotion_seconds"`
	DiscardedEpochRecords int     `json:"discarded_epoch_records"`
}

// Public is the status for an admin caller without the token: sessions
// without ids, guest names or tenants.
func (s Status) Public() any {
	red := hypervisor.Status{Sessions: s.Sessions, Tenancy: s.Tenancy}.Redacted()
	s.Sessions, s.Tenancy = red.Sessions, red.Tenancy
	return s
}

// Status reports the node in the one shape every role shares.
func (n *Node) Status() Status {
	role, term := n.auth.role()
	hs := n.srv.Status()
	st := Status{Role: role.String(), Term: term, Serving: hs.Primary && role != failover.Suspended, Backend: hs.Backend, GPUs: hs.GPUs, Sessions: hs.Sessions,
		DetachedSessions: hs.Detached, DeviceObjects: hs.Objects, DeviceMemoryBytes: hs.Bytes, Tenancy: hs.Tenancy,
		Replication: Replication{Direction: NoPeer, State: "off", Standbys: []StandbyLink{}}}
	if p := n.Promoted(); p != nil {
		st.Promotion = &PromotionStatus{Term: p.Term, LastHeard: p.LastHeard, Detected: p.Detected, Serving: p.Serving,
			DetectionSeconds: p.Detected.Sub(p.LastHeard).Seconds(), PromotionSeconds: p.Serving.Sub(p.Detected).Seconds(),
			DiscardedEpochRecords: p.DiscardedEpoch}
	}
	switch r := n.replication(); {
	case r != nil:
		var senders []replicate.SenderStatus
		for _, s := range r.senders() {
			senders = append(senders, s.Status())
		}
		st.Replication = senderView(n.cfg.Mode.String(), r.log.Status(), senders)
	case n.agent != nil && role == failover.Standby:
		st.Replication = receiverView(n.agent.Receiver.Status(), n.cfg.Now())
		if heard := n.auth.heardAt(); !heard.IsZero() {
			age := n.cfg.Now().Sub(heard).Seconds()
			st.Replication.HeartbeatAgeSeconds = &age
		}
	}
	return st
}

// senderView is a primary's log and its links to its standbys.
func senderView(mode string, ls replicate.LogStatus, senders []replicate.SenderStatus) Replication {
	v := Replication{Direction: ToStandby, State: "unprotected", Mode: mode, Connected: ls.Attached, InSync: ls.InSync,
		Protected: ls.Protected, MinInSync: ls.MinInSync, InSyncStandbys: ls.InSyncCount, LastSequence: ls.Last,
		AppliedSequence: ls.Applied, LagRecords: ls.LagOps, LagBytes: ls.LagBytes, LagSeconds: ls.LagSeconds,
		Epoch: ls.Epoch, Standbys: []StandbyLink{}}
	var peers []string
	protected := 0
	for _, s := range senders {
		peers = append(peers, s.Standby)
		v.Standbys = append(v.Standbys, StandbyLink{Peer: s.Standby, State: s.State, Connected: s.Attached, InSync: s.InSync,
			Protected: s.Protected, AppliedSequence: s.Applied, LagRecords: s.LagOps, LagBytes: s.LagBytes, LagSeconds: s.LagSeconds,
			ResyncsTotal: s.Resyncs, ResyncRestartsTotal: s.ResyncRestarts, RefusedPeersTotal: sum(s.Refused), LastError: s.LastError})
		v.RefusedPeersTotal += sum(s.Refused)
		v.RefusedPeers.add(s.Refused)
		v.Group, v.PrimaryID = s.Group, fmt.Sprintf("%016x", s.Primary)
		v.ResyncsTotal += s.Resyncs
		v.ResyncRestartsTotal += s.ResyncRestarts
		v.LastResyncPauseSeconds = max(v.LastResyncPauseSeconds, s.LastPauseMS/1000)
		v.LastResyncSeconds = max(v.LastResyncSeconds, s.LastResync)
		v.LastResyncBytes = max(v.LastResyncBytes, s.LastResyncBytes)
		v.LastResyncSnapshot = max(v.LastResyncSnapshot, s.LastSnapshot)
		if v.LastError == "" {
			v.LastError = s.LastError
		}
		if v.Resync == nil {
			v.Resync = resyncView(s.Resync)
		}
		if s.Protected {
			protected++
		}
	}
	v.Peer = strings.Join(peers, ",")
	switch {
	case ls.Protected:
		v.State = "protected"
	case protected > 0:
		v.State = "degraded"
	case ls.Attached:
		v.State = "resyncing"
	}
	return v
}

// receiverView is a standby's stream from its primary.
func receiverView(r receiver.ReceiverStatus, now time.Time) Replication {
	v := Replication{Direction: FromPrimary, Peer: r.Primary, Mode: r.Mode, Connected: r.Connected, InSync: r.InSync, Standbys: []StandbyLink{},
		LastSequence: r.Received, AppliedSequence: r.Applied, LagRecords: r.Received - min(r.Applied, r.Received),
		ApplyErrorsTotal: r.ApplyErrors, RefusedPeersTotal: r.RefusedPeers, Resync: resyncView(r.Resync)}
	v.RefusedPeers.add(r.Refused)
	if r.Follows != nil {
		v.Group, v.PrimaryID = r.Follows.Group, fmt.Sprintf("%016x", r.Follows.Primary)
	}
	switch {
	case !r.Connected:
		v.State = "disconnected"
		v.LastError = refusedText(r.KeyRefused, now)
	case r.Resyncing:
		v.State = "resyncing"
	case r.InSync:
		v.State = "in_sync"
	default:
		v.State = "catching_up"
	}
	return v
}

// refusedText says who was last refused at authentication, and how to
// fix it ("" for nobody).
func refusedText(k *receiver.KeyRefusal, now time.Time) string {
	switch {
	case k == nil:
		return ""
	case k.WrongKey:
		return fmt.Sprintf("a primary at %s is connecting and being refused (last %.0f s ago): its replication key differs from this node's; "+
			"put the same key file on both nodes (--replicate.key-file: copy the primary's here) and restart this standby", k.Peer, now.Sub(k.At).Seconds())
	}
	return fmt.Sprintf("a peer at %s connected and was refused (last %.0f s ago): %s (not a vgpuha primary of this protocol?)", k.Peer, now.Sub(k.At).Seconds(), k.Err)
}

// sum adds up counts by reason.
func sum(byReason map[string]uint64) uint64 {
	var n uint64
	for _, c := range byReason {
		n += c
	}
	return n
}

func resyncView(p replicate.ResyncProgress) *Resync {
	if !p.Active {
		return nil
	}
	return &Resync{BytesDone: p.BytesDone, BytesTotal: p.BytesTotal, RateBytesPerSecond: p.BytesPerSec, ETASeconds: p.ETASeconds}
}

// registerStandbyMetrics adds the takeover metrics of a node started as
// standby.
func (n *Node) registerStandbyMetrics() error {
	promotions := prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "vgpuha_promotions_total", Help: "Times this standby took over as primary."},
		func() float64 {
			if n.Promoted() != nil {
				return 1
			}
			return 0
		})
	detection := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vgpuha_last_detection_seconds", Help: "Silence from the old primary before the last promotion."},
		func() float64 {
			if p := n.Promoted(); p != nil {
				return p.DetectionMS / 1000
			}
			return 0
		})
	for _, c := range []prometheus.Collector{promotions, detection} {
		if err := n.cfg.Registry.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// AdminHandler is the node's admin mux (package admin guards it):
// /metrics (from reg), /healthz,
// /status, and POST /verify[?repair=true][&apertures=true], /switchover and /epoch, which
// answer 409 on a node that is not a replicating primary.
func (n *Node) AdminHandler(reg admin.Registry) *admin.Mux {
	mux := admin.Handler(reg, func() any { return n.Status() })
	mux.SetLogger(n.log)
	mux.SetHealth(n.health)
	mux.HandleFunc("POST /verify", n.primaryOnly(func(w http.ResponseWriter, r *http.Request) {
		var opts VerifyOptions
		opts.Repair, _ = strconv.ParseBool(r.URL.Query().Get("repair"))
		opts.Apertures, _ = strconv.ParseBool(r.URL.Query().Get("apertures"))
		rep, err := n.Verify(opts, 30*time.Second)
		if n.writeError(w, err) {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(rep)
	}))
	mux.HandleFunc("POST /switchover", n.primaryOnly(func(w http.ResponseWriter, r *http.Request) {
		pause, term, err := n.Switchover(10 * time.Second)
		if n.writeError(w, err) {
			return
		}
		fmt.Fprintf(w, "{\"guest_pause_seconds\": %.6f, \"term\": %d}\n", pause.Seconds(), term)
	}))
	mux.HandleFunc("POST /epoch", n.primaryOnly(func(w http.ResponseWriter, r *http.Request) {
		epoch, durable, err := n.CutEpoch()
		if n.writeError(w, err) {
			return
		}
		fmt.Fprintf(w, "{\"epoch\": %d, \"committed_on_standby\": %v}\n", epoch, durable)
	}))
	return mux
}

// primaryOnly answers 409 at once, saying what this node is, unless it is
// the primary (a fenced node keeps its stopped link; it must not wait on
// it).
func (n *Node) primaryOnly(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if role, _ := n.auth.role(); role != failover.Primary {
			http.Error(w, n.notReplicating(), http.StatusConflict)
			return
		}
		h(w, r)
	}
}

// writeError answers err, if any, in one line: 409 when the node cannot
// do it at all (saying what the node is instead), 503 when it failed.
func (n *Node) writeError(w http.ResponseWriter, err error) bool {
	switch {
	case err == nil:
		return false
	case IsNotReplicating(err):
		http.Error(w, n.notReplicating(), http.StatusConflict)
	default:
		http.Error(w, strings.Join(strings.Fields(err.Error()), " "), http.StatusServiceUnavailable)
	}
	return true
}

// notReplicating says why this node cannot verify, switch over or cut an
// epoch, and where to go instead.
func (n *Node) notReplicating() string {
	role, term := n.auth.role()
	switch role {
	case failover.Standby:
		return fmt.Sprintf("this node is a standby (term %d): verify, switchover and epoch go to the primary's admin address", term)
	case failover.Fenced:
		return fmt.Sprintf("this node is fenced (a node under term %d took over): verify, switchover and epoch go to the new primary's admin address", term)
	case failover.Suspended:
		return fmt.Sprintf("this primary (term %d) is suspended until it proves it still leads: try again shortly", term)
	}
	return fmt.Sprintf("this primary (term %d) has no standby to verify against or hand over to (started without --replicate-to)", term)
}
