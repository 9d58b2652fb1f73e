package failover

import "time"

// Role is what a node does.
type Role int

// Roles.
const (
	// Standby applies a primary's stream and watches its heartbeats.
	Standby Role = iota
	// Primary serves guests.
	Primary
	// Fenced: a node that learned of a newer term; it serves nothing.
	Fenced
)

func (r Role) String() string {
	switch r {
	case Standby:
		return "standby"
	case Primary:
		return "primary"
	}
	return "fenced"
}

// Node is one node's role logic, deterministic and free of I/O: the agents
// feed it what they observe (heartbeats, a complete replica, a peer's term)
// and act on the role it reports. Golden scenario tests drive two of them
// through crashes, freezes and partitions (testdata/roles).
type Node struct {
	Role   Role
	Term   uint64
	InSync bool // a standby holds a complete replica: it may take over
	det    Detector
}

// NewStandby returns a standby watching with det.
func NewStandby(det Detector) *Node { return &Node{Role: Standby, det: det} }

// NewPrimary returns the first primary, term 1.
func NewPrimary() *Node { return &Node{Role: Primary, Term: 1} }

// Heard records a heartbeat or record from a node at term, at time t.
func (n *Node) Heard(t time.Time, term uint64) {
	n.SawTerm(term)
	if n.Role == Standby && n.det != nil {
		n.det.Heartbeat(t)
		n.Term = max(n.Term, term)
	}
}

// SawTerm applies the fencing rule: a node that sees a higher term than its
// own while acting as primary stops serving.
func (n *Node) SawTerm(term uint64) {
	if term > n.Term && n.Role == Primary {
		n.Role = Fenced
	}
	if term > n.Term && n.Role != Standby {
		n.Term = term
	}
}

// Tick reports whether the standby takes over at t: it must hold a complete
// replica and its detector must suspect the primary. Taking over raises the
// term.
func (n *Node) Tick(t time.Time) bool {
	if n.Role != Standby || !n.InSync || n.det == nil || !n.det.Suspect(t) {
		return false
	}
	n.Role = Primary
	n.Term++
	return true
}

// HandOver makes a standby take over at once (a planned switchover).
func (n *Node) HandOver() {
	if n.Role == Standby {
		n.Role = Primary
		n.Term++
	}
}
