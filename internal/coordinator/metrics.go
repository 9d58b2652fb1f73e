package coordinator

import "github.com/prometheus/client_golang/prometheus"

// metrics are the coordinator's counters (etcd's HA vocabulary where it
// has a word: has_leader, leader changes).
type metrics struct {
	renewals      prometheus.Counter
	renewFailures prometheus.Counter
	leasesLost    prometheus.Counter
	// leasesRegained: a suspended leader proved it still leads.
	leasesRegained prometheus.Counter
	elections      *prometheus.CounterVec
	replacements   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, c *Coordinator) (*metrics, error) {
	m := &metrics{
		renewals: prometheus.NewCounter(prometheus.CounterOpts{Name: "vgpuha_coordinator_lease_renewals_total",
			Help: "Successful renewals of this node's coordinator lease."}),
		renewFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "vgpuha_coordinator_lease_renewal_failures_total",
			Help: "Renewals of this node's coordinator lease that failed or timed out."}),
		leasesLost: prometheus.NewCounter(prometheus.CounterOpts{Name: "vgpuha_coordinator_lease_losses_total",
			Help: "Times the lease went unrenewed for half its TTL (a leader then stops serving until it proves it still leads)."}),
		leasesRegained: prometheus.NewCounter(prometheus.CounterOpts{Name: "vgpuha_coordinator_lease_regains_total",
			Help: "Times a leader whose lease went unrenewed renewed it before etcd expired it and still led."}),
		elections: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpuha_coordinator_elections_total",
			Help: "Campaigns for the group's leader key, by result: won, refused (not the in-sync standby), failed."}, []string{"result"}),
		replacements: prometheus.NewCounter(prometheus.CounterOpts{Name: "vgpuha_coordinator_standby_replacements_total",
			Help: "Standbys this leader took from the group's pool."}),
	}
	for _, r := range []string{"won", "refused", "failed"} {
		m.elections.WithLabelValues(r)
	}
	leader := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vgpuha_coordinator_is_leader",
		Help: "1 while this node holds its group's leader key."}, func() float64 {
		if c.Leader() {
			return 1
		}
		return 0
	})
	for _, col := range []prometheus.Collector{m.renewals, m.renewFailures, m.leasesLost, m.leasesRegained, m.elections, m.replacements, leader} {
		if err := reg.Register(col); err != nil {
			return nil, err
		}
	}
	return m, nil
}
