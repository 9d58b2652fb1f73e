package hypervisor

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/hypervisor/guestconn"
	"github.com/vgpuha/vgpuha/hypervisor/internal/guesterr"
	"github.com/vgpuha/vgpuha/mmiotrace"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

type metrics struct {
	requests    *prometheus.CounterVec
	frameErrors *prometheus.CounterVec
	panics      *prometheus.CounterVec
	refusals    *prometheus.CounterVec
	inPlace     *prometheus.CounterVec
	// writeTimeouts counts guest connections dropped for reading none of
	// their replies in time (package guestconn).
	writeTimeouts prometheus.Counter
	// resumed and expired count detached sessions taken back by their
	// guest, and freed at the end of their grace period (lifetime.go).
	resumed, expired prometheus.Counter
	// readBackRepairs counts a standby's read-backs that found its bytes
	// different from what the guest read on the primary (readback.go).
	readBackRepairs prometheus.Counter
	// requestBytes counts guests' request frames' bytes (guestconn).
	requestBytes prometheus.Counter
	// globalsElsewhere counts module variables a standby holds at another
	// address than its primary (replica.Metrics).
	globalsElsewhere prometheus.Counter
	// imageBytes counts module image bytes loaded, by where they came
	// from: sent by the guest, or the node's image cache (package images).
	imageBytes *prometheus.CounterVec
	// latency by opcode, made once: a request finds its child by index,
	// not by hashing label values.
	latency []prometheus.Observer
	mmio    *mmiotrace.Metrics
}

func newMetrics(reg prometheus.Registerer, s *Server) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vgpuha_guest_requests_total",
			Help: "Guest requests handled, by opcode and status.",
		}, []string{"op", "status"}),
		frameErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vgpuha_guest_frame_errors_total",
			Help: "Guest connections dropped for an untrustworthy frame, by reason.",
		}, []string{"reason"}),
		panics: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vgpuha_guest_request_panics_total",
			Help: "Panics recovered while serving a guest request or applying a replicated record, by op: the request failed, never the node.",
		}, []string{"op"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vgpuha_guest_refusals_total",
			Help: "Guest requests refused to protect the node or other guests, by reason (resume_token, tenant_memory, buffer_budget, ...).",
		}, []string{"reason"}),
		inPlace: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vgpuha_guest_inplace_copy_bytes_total",
			Help: "Copy data taken from a guest's shared memory where it lay, by where it went: device (straight to the device), log (into a replication log buffer), private (a stream copy's private buffer); from a host-memory region: hostmem_device (straight to the device), hostmem_log (into a replication log buffer).",
		}, []string{"to"}),
		writeTimeouts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vgpuha_guest_write_timeouts_total",
			Help: "Guest connections dropped because the guest read none of its replies within --guest.write-timeout (its session is kept for its grace period).",
		}),
		resumed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vgpuha_guest_sessions_resumed_total",
			Help: "Sessions a guest took back after their connection ended (here, or on the node that served before this one took over).",
		}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vgpuha_guest_sessions_expired_total",
			Help: "Detached sessions freed because no guest resumed them within their grace period.",
		}),
		readBackRepairs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vgpuha_replica_read_back_repairs_total",
			Help: "Guest reads whose bytes this standby held differently (a kernel that is not reproducible, such as one with floating-point atomics) and took from the primary's read-back.",
		}),
		requestBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vgpuha_guest_request_bytes_total",
			Help: "Bytes of guests' request frames, headers and payloads (a copy's data however it arrived): what guests send, beside vgpuha_replication_sent_bytes_total, what the link carries.",
		}),
		globalsElsewhere: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vgpuha_replica_module_variables_elsewhere_total",
			Help: "Module variables whose address the guest holds that lie at another address on this standby than on its primary: launch arguments are mapped, but an address stored in device memory does not follow a failover (GPU workers lay out their address space alike to avoid it).",
		}),
		imageBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vgpuha_module_image_bytes_total",
			Help: "Module image bytes loaded, by where they came from: guest (sent with the load) or cache (named by hash, already on this node).",
		}, []string{"from"}),
	}
	for _, r := range guesterr.Reasons {
		m.refusals.WithLabelValues(r)
	}
	hist := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "vgpuha_guest_request_duration_seconds",
		Help:    "Time to execute a guest request on the backend, by opcode.",
		Buckets: prometheus.ExponentialBuckets(1e-6, 4, 12),
	}, []string{"op"})
	ops := abi.Opcodes()
	m.latency = make([]prometheus.Observer, ops[len(ops)-1]+1)
	for _, op := range ops {
		m.latency[op] = hist.WithLabelValues(op.String())
	}
	collectors := append([]prometheus.Collector{
		m.requests, m.frameErrors, m.panics, m.refusals, m.inPlace, hist, m.writeTimeouts, m.resumed, m.expired, m.readBackRepairs, m.requestBytes, m.globalsElsewhere, m.imageBytes,
		gpuCollector{s},
	}, gauges(s)...)
	for _, c := range collectors {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	var err error
	m.mmio, err = mmiotrace.NewMetrics(reg)
	return m, err
}

// gauges are the node's gauges, read from s when scraped: one row each.
func gauges(s *Server) []prometheus.Collector {
	status := func(f func(Status) float64) func() float64 {
		return func() float64 { return f(s.Status()) }
	}
	rows := []struct {
		name, help string
		value      func() float64
	}{
		{"vgpuha_is_primary", "1 while this node serves guests (not fenced).", func() float64 {
			if s.IsPrimary() {
				return 1
			}
			return 0
		}},
		{"vgpuha_term", "The term this node serves under.", func() float64 { return float64(s.Term()) }},
		{"vgpuha_guest_request_buffer_bytes", "Bytes of large guest frames buffered now, out of the node's request buffer budget.",
			func() float64 { return float64(s.edge.Budget().Used()) }},
		{"vgpuha_guest_reply_queue_bytes", "Bytes of replies guest connections hold queued now (each at most --guest.reply-queue-bytes and one reply).",
			func() float64 { return float64(s.edge.QueuedReplyBytes()) }},
		{"vgpuha_guest_sessions", "Open guest sessions.", status(func(st Status) float64 { return float64(len(st.Sessions)) })},
		{"vgpuha_guest_status_connections", "Open guest status connections (a guest's NVML watching the device without a session; at most --guest.max-status-connections).",
			func() float64 { return float64(s.statusConnections()) }},
		{"vgpuha_guest_sessions_detached", "Guest sessions no connection serves: kept for a resume, or a standby's replicas.",
			status(func(st Status) float64 { return float64(st.Detached) })},
		{"vgpuha_guest_sessions_detached_oldest_seconds", "How long the oldest detached session has been kept without a connection on this node (0: none; a standby's replicas are its primary's to time).",
			status(func(st Status) float64 { return st.OldestDetachedSeconds })},
		{"vgpuha_device_memory_bytes", "Device memory allocated by guests.", status(func(st Status) float64 { return float64(st.Bytes) })},
		{"vgpuha_device_objects", "Allocations and handles held by guests.", status(func(st Status) float64 { return float64(st.Objects) })},
	}
	out := make([]prometheus.Collector, len(rows))
	for i, g := range rows {
		out[i] = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: g.name, Help: g.help}, g.value)
	}
	return out
}

// gpuCollector reports each of the node's GPUs (Status.GPUs), labelled
// by its index, when scraped.
type gpuCollector struct{ s *Server }

var gpuDescs = struct{ sessions, used, promised, spares *prometheus.Desc }{
	prometheus.NewDesc("vgpuha_gpu_sessions", "Guest sessions placed on the GPU (by index: vgpuha status lists the GPUs).", []string{"gpu"}, nil),
	prometheus.NewDesc("vgpuha_gpu_memory_used_bytes", "Device memory the sessions placed on the GPU hold.", []string{"gpu"}, nil),
	prometheus.NewDesc("vgpuha_gpu_memory_promised_bytes", "Device memory the sessions placed on the GPU may allocate (their quotas): what placement counts as taken.", []string{"gpu"}, nil),
	prometheus.NewDesc("vgpuha_gpu_spares_ready", "Contexts (GPU workers with --guest.workers) made ahead and ready for new sessions on the GPU, of --cuda.spare-contexts.", []string{"gpu"}, nil),
}

func (gpuCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- gpuDescs.sessions
	ch <- gpuDescs.used
	ch <- gpuDescs.promised
	ch <- gpuDescs.spares
}

func (c gpuCollector) Collect(ch chan<- prometheus.Metric) {
	for _, g := range c.s.Status().GPUs {
		i := strconv.Itoa(g.Index)
		ch <- prometheus.MustNewConstMetric(gpuDescs.sessions, prometheus.GaugeValue, float64(g.Sessions), i)
		ch <- prometheus.MustNewConstMetric(gpuDescs.used, prometheus.GaugeValue, float64(g.UsedBytes), i)
		ch <- prometheus.MustNewConstMetric(gpuDescs.promised, prometheus.GaugeValue, float64(g.PromisedBytes), i)
		ch <- prometheus.MustNewConstMetric(gpuDescs.spares, prometheus.GaugeValue, float64(g.Spares), i)
	}
}

// countImageBytes counts n bytes of module images loaded from (guest or cache).
func (m *metrics) countImageBytes(from string, n int64) {
	m.imageBytes.WithLabelValues(from).Add(float64(n))
}

// countInPlace counts n copy bytes taken where they lay, by where they went.
func (m *metrics) countInPlace(to string, n int) { m.inPlace.WithLabelValues(to).Add(float64(n)) }

// edge is the counters a node's guest connections add to.
func (m *metrics) edge() *guestconn.Metrics {
	return &guestconn.Metrics{Requests: m.requests, FrameErrors: m.frameErrors, Refusals: m.refusals, WriteTimeouts: m.writeTimeouts,
		RequestBytes: m.requestBytes, Latency: m.latency}
}
