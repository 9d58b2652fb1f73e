package mmiotrace

import "github.com/prometheus/client_golang/prometheus"

// Metrics are a tracer's Prometheus counters, labelled by mode. A nil
// *Metrics counts nothing.
type Metrics struct {
	faults        *prometheus.CounterVec
	records       *prometheus.CounterVec
	bytes         *prometheus.CounterVec
	dirtyPerFlush *prometheus.HistogramVec
	fallbacks     *prometheus.CounterVec
}

// NewMetrics registers the tracer metrics with reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		faults: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vgpuha_mmio_faults_total", Help: "Guest write faults handled by the MMIO tracer.",
		}, []string{"mode"}),
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vgpuha_mmio_records_total", Help: "MMIO writes or changed ranges flushed into the log.",
		}, []string{"mode"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vgpuha_mmio_bytes_total", Help: "Bytes of aperture data flushed into the log.",
		}, []string{"mode"}),
		dirtyPerFlush: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "vgpuha_mmio_dirty_pages_per_flush", Help: "Pages found written at a flush (page and uffd modes).",
			Buckets: prometheus.ExponentialBuckets(1, 4, 8),
		}, []string{"mode"}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vgpuha_mmio_fallback_steps_total",
			Help: "Stores single-stepped instead of emulated; reason undecodable counts decode failures (page compared before and after).",
		}, []string{"mode", "reason"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.faults, m.records, m.bytes, m.dirtyPerFlush, m.fallbacks} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func (m *Metrics) fault(mode Mode) {
	if m != nil {
		m.faults.WithLabelValues(mode.String()).Inc()
	}
}

func (m *Metrics) fallback(mode Mode, reason string) {
	if m != nil {
		m.fallbacks.WithLabelValues(mode.String(), reason).Inc()
	}
}

func (m *Metrics) flushed(mode Mode, records, bytes, pages uint64) {
	if m == nil {
		return
	}
	m.records.WithLabelValues(mode.String()).Add(float64(records))
	m.bytes.WithLabelValues(mode.String()).Add(float64(bytes))
	if mode == ModePage || mode == ModeUffd || mode == ModeKmodPage || mode == ModeKmodAuto || mode == ModeAuto {
		m.dirtyPerFlush.WithLabelValues(mode.String()).Observe(float64(pages))
	}
}

// SumCounters sums each counter family of reg over its labels (a tracer's
// counters across modes and reasons, for a report).
func SumCounters(reg prometheus.Gatherer) map[string]float64 {
	out := map[string]float64{}
	families, _ := reg.Gather()
	for _, f := range families {
		for _, m := range f.GetMetric() {
			out[f.GetName()] += m.GetCounter().GetValue()
		}
	}
	return out
}
