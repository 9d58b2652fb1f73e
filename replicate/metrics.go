package replicate

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/replicate/admission"
)

// Metrics are the primary's replication metrics.
type Metrics struct {
	sentBytes prometheus.Counter
	sentOps   prometheus.Counter
	resyncs   prometheus.Counter
	pause     prometheus.Histogram

	heartbeatFailures prometheus.Counter
	refused           *prometheus.CounterVec
}

// NewMetrics registers the primary's replication metrics for the standby
// at addr on reg, labelled standby=addr (a primary may stream to several);
// status is read at scrape time.
func NewMetrics(reg prometheus.Registerer, addr string, status func() SenderStatus) (*Metrics, error) {
	reg = prometheus.WrapRegistererWith(prometheus.Labels{"standby": addr}, reg)
	m := &Metrics{
		sentBytes:         prometheus.NewCounter(prometheus.CounterOpts{Name: "vgpuha_replication_sent_bytes_total", Help: "Record bytes sent to the standby."}),
		sentOps:           prometheus.NewCounter(prometheus.CounterOpts{Name: "vgpuha_replication_sent_records_total", Help: "Records sent to the standby, snapshots included."}),
		resyncs:           prometheus.NewCounter(prometheus.CounterOpts{Name: "vgpuha_replication_resyncs_total", Help: "Standby resyncs from a snapshot."}),
		heartbeatFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "vgpuha_heartbeat_send_failures_total", Help: "Heartbeats to the standby that could not be sent (TCP or UDP)."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpuha_replication_refused_peers_total",
			Help: "Times the standby refused this primary's stream, by reason (stale_term, other_group, other_primary, rewound)."}, []string{"reason"}),
		pause: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "vgpuha_replication_resync_pause_seconds", Help: "Time guests were stopped to take a resync snapshot.",
			Buckets: prometheus.ExponentialBuckets(1e-5, 4, 10),
		}),
	}
	for _, r := range []admission.RefuseReason{admission.RefusedStaleTerm, admission.RefusedOtherGroup, admission.RefusedOtherPrimary, admission.RefusedRewound} {
		m.refused.WithLabelValues(r.String()) // every series from the start, at 0
	}
	gauge := func(name, help string, f func(SenderStatus) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return f(status()) })
	}
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	for _, c := range []prometheus.Collector{
		m.sentBytes, m.sentOps, m.resyncs, m.pause, m.heartbeatFailures, m.refused,
		gauge("vgpuha_replication_lag_records", "Records the standby has not yet applied.", func(s SenderStatus) float64 { return float64(s.LagOps) }),
		gauge("vgpuha_replication_lag_bytes", "Bytes of records the standby has not yet applied.", func(s SenderStatus) float64 { return float64(s.LagBytes) }),
		gauge("vgpuha_replication_lag_seconds", "Age of the oldest record the standby has not applied.", func(s SenderStatus) float64 { return s.LagSeconds }),
		gauge("vgpuha_replication_last_sequence", "Sequence of the newest log record.", func(s SenderStatus) float64 { return float64(s.Last) }),
		gauge("vgpuha_replication_applied_sequence", "Last sequence the standby acknowledged as applied.", func(s SenderStatus) float64 { return float64(s.Applied) }),
		gauge("vgpuha_replication_resync_active", "1 while a resync snapshot streams to the standby.", func(s SenderStatus) float64 { return b2f(s.Resync.Active) }),
		gauge("vgpuha_replication_resync_bytes", "Snapshot contents bytes sent in the current (or last) resync.", func(s SenderStatus) float64 { return float64(s.Resync.BytesDone) }),
		gauge("vgpuha_replication_resync_total_bytes", "Snapshot contents bytes of the current (or last) resync.", func(s SenderStatus) float64 { return float64(s.Resync.BytesTotal) }),
		gauge("vgpuha_replication_resync_rate_bytes_per_second", "Rate of the resync under way.", func(s SenderStatus) float64 { return s.Resync.BytesPerSec }),
		gauge("vgpuha_replication_resync_eta_seconds", "Estimated time left in the resync under way.", func(s SenderStatus) float64 { return s.Resync.ETASeconds }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "vgpuha_replication_resync_restarts_total", Help: "Resyncs that started over (resync budget exceeded or snapshot unreadable)."},
			func() float64 { return float64(status().ResyncRestarts) }),
		gauge("vgpuha_replication_protected", "1 when a caught-up standby holds every acknowledged op.", func(s SenderStatus) float64 { return b2f(s.Protected) }),
	} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
