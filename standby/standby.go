// Package standby is the standby agent: it accepts the primary's
// authenticated replication stream, applies every record to its own replica
// GPU through the same session code the primary runs (so the stream is
// validated, handles and addresses are reproduced and checked, and addresses
// are translated where the replica's window could not be placed at the
// primary's base), acknowledges what it applied, and answers verification.
//
// It must never trust the stream: a record that fails validation or gives
// a different result marks its session unsafe (shown in /status and by
// verify) and changes nothing else. It never decides a role: what the link
// observes (the primary heard, the replica in sync, a switchover asked
// for) goes to its node's role authority (Roles), and the authority tells
// its Receiver to stop applying (Receiver.Fence) when the node takes over.
package standby

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/replica"
	"github.com/vgpuha/vgpuha/replicate"
	"github.com/vgpuha/vgpuha/replicate/admission"
	"github.com/vgpuha/vgpuha/replicate/link"
	"github.com/vgpuha/vgpuha/replicate/receiver"
	"github.com/vgpuha/vgpuha/replicate/verify"
)

// Roles is the node's role authority, told what the replication link
// observes (see receiver.Replica).
type Roles interface {
	Heard(term uint64)
	Synced(inSync bool)
	HandOver() (term uint64, ok bool)
}

// Agent is a standby node's replication end.
type Agent struct {
	Server   *hypervisor.Server // the replica: sessions rebuilt from the stream
	Applier  *replica.Applier   // applies the stream to Server's sessions
	Receiver *receiver.Receiver

	Roles
	log           *slog.Logger
	key           []byte
	mu            sync.Mutex
	stopUDP       context.CancelFunc
	badHeartbeats prometheus.Counter
}

// Apply implements receiver.Applier on the replica server.
func (a *Agent) Apply(r *replicate.Record) error { return a.Applier.Apply(r) }

// Mark implements receiver.Settler: the replica's copies from receive
// buffers may stay queued on its GPU until settled (replica.Applier's
// QueueCopies).
func (a *Agent) Mark() uint64 { return a.Applier.Mark() }

// Settle implements receiver.Settler.
func (a *Agent) Settle(upTo uint64) error { return a.Applier.Settle(upTo) }

// Idle implements receiver.Idler.
func (a *Agent) Idle(session uint64) { a.Applier.Idle(session) }

// ReadMatches implements receiver.ReadChecker.
func (a *Agent) ReadMatches(r *replicate.Record) bool { return a.Applier.ReadMatches(r) }

// Checksums implements receiver.Applier.
func (a *Agent) Checksums() []verify.ObjectSum { return a.Applier.Checksums() }

// Admission says which primaries a standby follows
// (receiver.ReceiverConfig's Group and Adopt).
type Admission struct {
	// Group, when set, is the only group whose primaries it follows.
	Group string
	// Adopt: the first primary to connect is followed whatever its
	// group.
	Adopt bool
}

// New returns a standby applying to srv's backend, authenticating
// primaries with key, admitting them by adm and telling roles what it
// observes. Metrics are registered on reg.
func New(srv *hypervisor.Server, backend gpu.Backend, key []byte, adm Admission, roles Roles, reg prometheus.Registerer, log *slog.Logger) (*Agent, error) {
	applyTime := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "vgpuha_standby_apply_duration_seconds",
		Help:    "Time to apply one replicated record on the replica, by record kind.",
		Buckets: prometheus.ExponentialBuckets(1e-6, 4, 12),
	}, []string{"op"})
	if err := reg.Register(applyTime); err != nil {
		return nil, err
	}
	a := &Agent{Server: srv, Applier: replica.New(srv, log), Roles: roles, log: log, key: key}
	a.Applier.QueueCopies() // the receiver settles them (receiver.Settler)
	rcfg := receiver.ReceiverConfig{
		Key: key, Replica: a, Logger: log, Group: adm.Group, Adopt: adm.Adopt,
		ParallelSessions: true, // replica.Applier locks each session; sessions share no state a record changes
		Observe:          func(op replicate.Op, d time.Duration) { applyTime.WithLabelValues(op.String()).Observe(d.Seconds()) },
	}
	if ha, ok := gpu.Host(backend).(gpu.HostAllocator); ok { // page-locked for every GPU (CUDA: portable)
		rcfg.HostBuffer = func(n int) []byte {
			if b, err := ha.AllocHost(n); err == nil {
				return b
			}
			return make([]byte, n)
		}
	}
	rcv, err := receiver.NewReceiver(rcfg)
	if err != nil {
		return nil, err
	}
	a.Receiver = rcv
	if err := a.registerMetrics(reg); err != nil {
		return nil, err
	}
	return a, nil
}

func (a *Agent) registerMetrics(reg prometheus.Registerer) error {
	rcv := a.Receiver
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	a.badHeartbeats = prometheus.NewCounter(prometheus.CounterOpts{Name: "vgpuha_heartbeat_receive_failures_total",
		Help: "Heartbeat datagrams refused: wrong key, malformed, replayed, or from a primary this standby does not follow."})
	for _, c := range []prometheus.Collector{
		a.badHeartbeats,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vgpuha_standby_applied_sequence", Help: "Last log sequence applied (or buffered, in epoch mode)."},
			func() float64 { return float64(rcv.Status().Applied) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vgpuha_standby_connected", Help: "1 while a primary's stream is attached."},
			func() float64 { return b2f(rcv.Status().Connected) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vgpuha_standby_in_sync", Help: "1 while the replica is a complete copy (0 from a resync's start to its snapshot's end)."},
			func() float64 { return b2f(rcv.Status().InSync) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vgpuha_standby_resync_bytes", Help: "Snapshot bytes applied in the current (or last) resync."},
			func() float64 { return float64(rcv.Status().Resync.BytesDone) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vgpuha_standby_resync_total_bytes", Help: "Snapshot contents bytes of the current (or last) resync."},
			func() float64 { return float64(rcv.Status().Resync.BytesTotal) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vgpuha_standby_resync_eta_seconds", Help: "Estimated time left in the resync under way."},
			func() float64 { return rcv.Status().Resync.ETASeconds }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "vgpuha_standby_apply_errors_total", Help: "Records the replica could not apply as the primary did."},
			func() float64 { return float64(rcv.Status().ApplyErrors) }),
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	for _, reason := range admission.RefuseReasons() {
		name := reason.String()
		c := prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "vgpuha_standby_refused_peers_total",
			Help:        "Replication connections refused, by reason: auth (failed the handshake), fenced (this node was promoted), stale_term, other_group, other_primary, rewound (package replicate/admission).",
			ConstLabels: prometheus.Labels{"reason": name}},
			func() float64 { return float64(rcv.Status().Refused[name]) })
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// Serve accepts the primary's stream on ln until ln is closed, and its UDP
// heartbeats on the same address until Close.
func (a *Agent) Serve(ln net.Listener) error {
	ctx, cancel := context.WithCancel(context.Background())
	a.mu.Lock()
	a.stopUDP = cancel
	a.mu.Unlock()
	go func() {
		if err := link.ListenUDPHeartbeats(ctx, ln.Addr().String(), a.key, a.heardDatagram, a.badHeartbeats.Inc); err != nil {
			a.log.Warn("no UDP heartbeat path; failure detection relies on the TCP link alone", "err", err)
		}
	}()
	return a.Receiver.Serve(ln)
}

// heardDatagram: a heartbeat datagram from primary under term. Only the
// primary this standby follows is heard: a stray one holding the key must
// not keep it from taking over when its own primary dies (its datagrams
// are counted as refused). Before a primary's link was admitted none is
// heard, nor counted: the standby has no replica to judge with yet.
func (a *Agent) heardDatagram(primary, term uint64) {
	switch followed, ok := a.Receiver.Followed(); {
	case !ok:
	case primary != followed:
		a.badHeartbeats.Inc()
	default:
		a.Heard(term)
	}
}

// Close drops the link and stops the heartbeat listener.
func (a *Agent) Close() {
	a.mu.Lock()
	if a.stopUDP != nil {
		a.stopUDP()
	}
	a.mu.Unlock()
	a.Receiver.Close()
}
