package node

import (
	"fmt"

	"github.com/vgpuha/vgpuha/failover"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
)

// health is /healthz's answer: nil while the node can do its role's job,
// else why not. A primary's job is to serve guests (a promoted standby
// whose guest endpoint is taken is not doing it, however well it
// replicates); a standby's is to apply a primary's stream (one with no
// primary connected protects nobody; a coordinated one waits in its
// group's pool to be picked, which is its job); a fenced node has none.
// The GPU must be healthy in every role.
func (n *Node) health() error {
	role, term := n.auth.role()
	switch role {
	case failover.Fenced:
		return fmt.Errorf("fenced: a node under term %d took over; this node serves no guests", term)
	case failover.Suspended:
		return fmt.Errorf("suspended: its coordinator lease (term %d) went unrenewed; answering no guest until it proves it still leads or another node does", term)
	case failover.Primary:
		if !n.srv.IsPrimary() {
			n.mu.Lock()
			err := n.guestListenErr
			n.mu.Unlock()
			return fmt.Errorf("primary under term %d but not serving guests: cannot listen on %s (--guest-listen): %v; retrying every 100 ms",
				term, n.cfg.GuestListen, err)
		}
	case failover.Standby:
		if n.agent == nil || n.cfg.Coordinator != nil {
			break
		}
		if r := n.agent.Receiver.Status(); !r.Connected {
			if why := refusedText(r.KeyRefused, n.cfg.Now()); why != "" {
				return fmt.Errorf("standby applying nothing: %s", why)
			}
			return fmt.Errorf("standby applying nothing: no primary's stream is connected to %s (is the primary up, and its --replicate-to this address?)",
				n.replLn.Addr())
		}
	}
	if h, ok := n.cfg.Backend.(gpu.HealthReporter); ok {
		return h.Healthy()
	}
	return nil
}
