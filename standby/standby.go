// Package standby is the standby agent: it accepts the primary's
// authenticated replication stream, applies every record to its own replica
// GPU through the same session code the primary runs (so the stream is
// validated, handles and addresses are reproduced and checked, and addresses
// are translated where the replica's window could not be placed at the
// primary's base), acknowledges what it applied, and answers verification.
//
// It must never trust the stream: a record that fails validation or gives
// a different result marks its session unsafe (shown in /status and by
// verify) and changes nothing else.
package standby

import (
	"context"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/replicate"
)

// Agent is a standby node.
type Agent struct {
	Server   *hypervisor.Server // the replica: sessions rebuilt from the stream
	Receiver *replicate.Receiver

	log           *slog.Logger
	key           []byte
	stopUDP       context.CancelFunc
	pcfg          PromoteConfig
	sender        *replicate.Sender // once promoted with a next standby
	w             watcher
	promotions    prometheus.Counter
	badHeartbeats prometheus.Counter
}

// applier adapts the replica server to replicate.Applier.
type applier struct{ srv *hypervisor.Server }

func (a applier) Apply(r *replicate.Record) error  { return a.srv.ApplyRecord(r) }
func (a applier) Checksums() []replicate.ObjectSum { return a.srv.Checksums() }

// New returns a standby applying to backend, authenticating primaries with
// key. Metrics are registered on reg.
func New(backend gpu.Backend, cfg hypervisor.Config, key []byte, reg prometheus.Registerer, log *slog.Logger) (*Agent, error) {
	srv, err := hypervisor.NewServer(backend, cfg, reg, log)
	if err != nil {
		return nil, err
	}
	applyTime := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "vgpuha_standby_apply_duration_seconds",
		Help:    "Time to apply one replicated record on the replica, by record kind.",
		Buckets: prometheus.ExponentialBuckets(1e-6, 4, 12),
	}, []string{"op"})
	if err := reg.Register(applyTime); err != nil {
		return nil, err
	}
	a := &Agent{Server: srv, log: log, key: key}
	rcfg := replicate.ReceiverConfig{
		OnHeard: a.heard,
		Key:     key, Applier: applier{srv}, Log: log,
		Observe: func(op replicate.Op, d time.Duration) { applyTime.WithLabelValues(op.String()).Observe(d.Seconds()) },
	}
	if ha, ok := backend.(gpu.HostAllocator); ok {
		rcfg.HostBuffer = func(n int) []byte {
			if b, err := ha.AllocHost(n); err == nil {
				return b
			}
			return make([]byte, n)
		}
	}
	rcv, err := replicate.NewReceiver(rcfg)
	if err != nil {
		return nil, err
	}
	a.Receiver = rcv
	a.promotions = prometheus.NewCounter(prometheus.CounterOpts{Name: "vgpuha_promotions_total", Help: "Times this standby took over as primary."})
	a.badHeartbeats = prometheus.NewCounter(prometheus.CounterOpts{Name: "vgpuha_heartbeat_receive_failures_total",
		Help: "Heartbeat datagrams refused: wrong key, malformed, or replayed."})
	gauges := []prometheus.Collector{
		a.promotions, a.badHeartbeats,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vgpuha_last_detection_seconds", Help: "Silence from the old primary before the last promotion."},
			func() float64 {
				if p := a.Promoted(); p != nil {
					return p.DetectionMS / 1000
				}
				return 0
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vgpuha_standby_applied_sequence", Help: "Last log sequence applied (or buffered, in epoch mode)."},
			func() float64 { return float64(rcv.Status().Applied) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vgpuha_standby_connected", Help: "1 while a primary's stream is attached."},
			func() float64 {
				if rcv.Status().Connected {
					return 1
				}
				return 0
			}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "vgpuha_standby_apply_errors_total", Help: "Records the replica could not apply as the primary did."},
			func() float64 { return float64(rcv.Status().ApplyErrors) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "vgpuha_standby_refused_peers_total", Help: "Replication connections refused for failing authentication."},
			func() float64 { return float64(rcv.Status().RefusedPeers) }),
	}
	for _, g := range gauges {
		if err := reg.Register(g); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// Serve accepts the primary's stream on ln until ln is closed, and its UDP
// heartbeats on the same address until Close.
func (a *Agent) Serve(ln net.Listener) error {
	ctx, cancel := context.WithCancel(context.Background())
	a.w.mu.Lock()
	a.stopUDP = cancel
	a.w.mu.Unlock()
	go func() {
		if err := replicate.ListenUDPHeartbeats(ctx, ln.Addr().String(), a.key, func(uint64) { a.heard() }, a.badHeartbeats.Inc); err != nil {
			a.log.Warn("no UDP heartbeat path; failure detection relies on the TCP link alone", "err", err)
		}
	}()
	return a.Receiver.Serve(ln)
}

// Status is the standby's /status.
type Status struct {
	Role      string     `json:"role"`
	Promotion *Promotion `json:"promotion,omitempty"`
	// Protection is the promoted node's own replication to the next standby.
	Protection  *replicate.SenderStatus  `json:"protection,omitempty"`
	Replication replicate.ReceiverStatus `json:"replication"`
	Replica     hypervisor.Status        `json:"replica"`
}

// Status reports the replica and the link.
func (a *Agent) Status() Status {
	st := Status{Role: "standby", Replication: a.Receiver.Status(), Replica: a.Server.Status(), Promotion: a.Promoted()}
	if st.Promotion != nil {
		st.Role = "primary (promoted)"
	}
	a.w.mu.Lock()
	sender := a.sender
	a.w.mu.Unlock()
	if sender != nil {
		ps := sender.Status()
		st.Protection = &ps
	}
	return st
}

// Close drops the link and frees the replica.
func (a *Agent) Close() {
	a.w.mu.Lock()
	if a.stopUDP != nil {
		a.stopUDP()
	}
	a.w.mu.Unlock()
	a.Receiver.Close()
	a.Server.Close()
}
