package drill

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/vgpuha/vgpuha/internal/lab/drill/nodeproc"
	"github.com/vgpuha/vgpuha/replicate/verify"
)

// Nodes is a primary and a standby running as processes of their own on
// loopback, as a deployment runs them, for benchmarks that must not
// measure one process's address space, scheduler and garbage collector
// shared by both nodes and the guests (bench resync --processes). The
// primary starts alone; the standby joins on StartStandby.
type Nodes struct {
	p *pair
	// keepLogs: something failed; Close leaves the nodes' logs.
	keepLogs bool
}

// NodesOptions says how to start Nodes.
type NodesOptions struct {
	Binary         string // the vgpuha binary
	Backend        string // --backend of both nodes
	StandbyBackend string // the standby's, when not Backend's
	Mode           string // replication mode (default commit)
	// Flags go to both nodes (quotas, the software GPU's size),
	// PrimaryFlags to the primary only (resync settings).
	Flags, PrimaryFlags []string
	// KeepLogs leaves the nodes' logs after Close (KeptLogs says where);
	// they are kept anyway when something failed.
	KeepLogs bool
	// LinkRate, when above 0, puts each node in a network namespace of
	// its own, joined by a veth link whose primary-to-standby direction
	// carries at most LinkRate bytes per second (a token bucket, tc tbf):
	// a replication link slower than the guests' copies, as between
	// hosts. Needs root and iproute2 (NetnsAvailable).
	LinkRate int64
}

// StartNodes starts the primary and waits until it serves guests.
func StartNodes(o NodesOptions) (*Nodes, error) {
	if o.Mode == "" {
		o.Mode = "commit"
	}
	p, err := newPair(o.Binary, o.Backend, o.Flags)
	if err != nil {
		return nil, err
	}
	p.standbyBackend, p.primaryFlags = o.StandbyBackend, o.PrimaryFlags
	if err := p.launch(o.Mode, o.LinkRate > 0, "unix", true); err != nil {
		return nil, err
	}
	if o.LinkRate > 0 {
		if err := p.limitLink(o.LinkRate); err != nil {
			p.stop()
			return nil, err
		}
	}
	return &Nodes{p: p, keepLogs: o.KeepLogs}, nil
}

// KeptLogs is where the nodes' logs stay after Close, or "" when Close
// removes them.
func (n *Nodes) KeptLogs() string {
	if n.keepLogs {
		return n.p.dir
	}
	return ""
}

// Endpoints are where guests reach the primary, and the standby after a
// failover.
func (n *Nodes) Endpoints() (primary string, failover []string) {
	return n.p.primaryEP, []string{n.p.standbyEP}
}

// StartStandby starts the standby; the primary begins resyncing it.
func (n *Nodes) StartStandby() error { return n.p.startStandby() }

// WaitProtected waits until the primary says its standby protects it.
func (n *Nodes) WaitProtected(d time.Duration) error {
	if err := nodeproc.WaitFor(d, n.p.protected); err != nil {
		n.keepLogs = true
		return fmt.Errorf("the standby never protected the primary (logs in %s): %w", n.p.dir, err)
	}
	return nil
}

// ResyncFigures are the primary's figures of its last resync (its
// /status replication section).
type ResyncFigures struct {
	PauseSeconds float64 `json:"last_resync_pause_seconds"`
	Seconds      float64 `json:"last_resync_seconds"`
	Bytes        uint64  `json:"last_resync_bytes"`
	// SnapshotSeconds: of Seconds, until the snapshot was on the link.
	SnapshotSeconds float64 `json:"last_resync_snapshot_seconds"`
	Restarts        uint64  `json:"resync_restarts_total"`
}

// LastResync reads the primary's figures of its last resync.
func (n *Nodes) LastResync() (ResyncFigures, error) {
	var st struct{ Replication ResyncFigures }
	err := n.p.primary.Status(&st)
	return st.Replication, err
}

// Verify asks the primary to compare every object with the standby's.
func (n *Nodes) Verify(timeout time.Duration) (verify.Report, error) {
	var rep verify.Report
	body, err := n.p.primary.Do(http.MethodPost, "/verify", timeout)
	if err == nil {
		err = json.Unmarshal(body, &rep)
	}
	if err != nil || !rep.Match {
		n.keepLogs = true // what each node applied is the first thing to read
	}
	return rep, err
}

// Close stops both nodes and removes their files (but the logs, when
// asked to keep them, or after WaitProtected or Verify failed).
func (n *Nodes) Close() {
	if n.keepLogs {
		n.p.stopKeepingLogs()
		return
	}
	n.p.stop()
}

// LagBytes reads the bytes the primary's log holds that its standby has
// not applied (its /status replication lag_bytes).
func (n *Nodes) LagBytes() (int64, error) {
	var st struct {
		Replication struct {
			LagBytes int64 `json:"lag_bytes"`
		}
	}
	err := n.p.primary.Status(&st)
	return st.Replication.LagBytes, err
}
