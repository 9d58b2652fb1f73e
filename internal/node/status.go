package node

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/failover"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/internal/admin"
	"github.com/vgpuha/vgpuha/replicate"
)

// PrimaryStatus is /status of a node started as primary.
type PrimaryStatus struct {
	Role string `json:"role"`
	hypervisor.Status
	Replication *replicate.SenderStatus `json:"replication,omitempty"`
}

// StandbyStatus is /status of a node started as standby.
type StandbyStatus struct {
	Role      string     `json:"role"`
	Term      uint64     `json:"term"`
	Promotion *Promotion `json:"promotion,omitempty"`
	// Protection is the promoted node's own replication to the next standby.
	Protection  *replicate.SenderStatus  `json:"protection,omitempty"`
	Replication replicate.ReceiverStatus `json:"replication"`
	Replica     hypervisor.Status        `json:"replica"`
}

// Public is the primary's status for an admin caller without the token:
// sessions without ids, guest names or tenants.
func (s PrimaryStatus) Public() any {
	s.Status = s.Status.Redacted()
	return s
}

// Public is the standby's status for an admin caller without the token.
func (s StandbyStatus) Public() any {
	s.Replica = s.Replica.Redacted()
	return s
}

// Status reports the node: a PrimaryStatus or a StandbyStatus, by how the
// node was started.
func (n *Node) Status() any {
	role, term := n.auth.role()
	var sender *replicate.SenderStatus
	if r := n.replication(); r != nil {
		ss := r.sender.Status()
		sender = &ss
	}
	if n.agent == nil {
		return PrimaryStatus{Role: role.String(), Status: n.srv.Status(), Replication: sender}
	}
	st := StandbyStatus{Role: role.String(), Term: term, Promotion: n.Promoted(), Protection: sender,
		Replication: n.agent.Receiver.Status(), Replica: n.srv.Status()}
	if st.Promotion != nil && role == failover.Primary {
		st.Role = "primary (promoted)"
	}
	return st
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
// /status, and POST /verify[?repair=true], /switchover and /epoch, which
// answer 409 on a node that is not a replicating primary.
func (n *Node) AdminHandler(reg admin.Registry) *admin.Mux {
	mux := admin.Handler(reg, n.Status)
	mux.SetLogger(n.log)
	mux.SetHealth(func() error {
		if role, term := n.auth.role(); role == failover.Fenced {
			return fmt.Errorf("fenced: a node under term %d took over; this node serves no guests", term)
		}
		if h, ok := n.cfg.Backend.(gpu.HealthReporter); ok {
			return h.Healthy()
		}
		return nil
	})
	mux.HandleFunc("POST /verify", func(w http.ResponseWriter, r *http.Request) {
		repair, _ := strconv.ParseBool(r.URL.Query().Get("repair"))
		rep, err := n.Verify(repair, 30*time.Second)
		if writeError(w, err) {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(rep)
	})
	mux.HandleFunc("POST /switchover", func(w http.ResponseWriter, r *http.Request) {
		pause, term, err := n.Switchover(10 * time.Second)
		if writeError(w, err) {
			return
		}
		fmt.Fprintf(w, "{\"guest_pause_ms\": %.3f, \"term\": %d}\n", float64(pause.Microseconds())/1000, term)
	})
	mux.HandleFunc("POST /epoch", func(w http.ResponseWriter, r *http.Request) {
		epoch, durable, err := n.CutEpoch()
		if writeError(w, err) {
			return
		}
		fmt.Fprintf(w, "{\"epoch\": %d, \"committed_on_standby\": %v}\n", epoch, durable)
	})
	return mux
}

// writeError answers err, if any: 409 when the node cannot do it at all,
// 503 when it failed.
func writeError(w http.ResponseWriter, err error) bool {
	switch {
	case err == nil:
		return false
	case IsNotReplicating(err):
		http.Error(w, err.Error(), http.StatusConflict)
	default:
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
	}
	return true
}
