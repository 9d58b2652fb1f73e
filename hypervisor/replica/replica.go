// Package replica is the replica side of a hypervisor node: how a
// replica is built (Snapshot: the resync snapshot a primary streams to a
// new standby, its objects then its device memory) and how one is kept
// (Applier: every record of the primary's log applied to this node's
// sessions through the sessions' own validation and execution, so that a
// standby checks the stream exactly as the primary checked the guest).
//
// It owns the record kinds' dispatch on a standby, placing a resync's
// objects where the primary had them, the verdict on each applied record
// (a result or failure the primary did not get marks its session unsafe),
// read-back repairs, the queued copies of replayed records (Mark, Settle)
// and the recovery from a panic while applying. It must never trust a
// record (every guest operation runs through the session's handler, with
// its checks), never open a guest connection or decide a role, and never
// import the hypervisor's root: the node plugs a hypervisor.Server in as
// Sessions.
//
// The one difference from serving a guest is waiting: a replica's
// host-to-device copy may stay queued on its GPU (QueueCopies), since the
// standby keeps the record's buffer until it settles the copy, where a
// guest's buffer is reused once its call returns. (Measured on two H200s,
// primary and standby on a GPU each: the standby's applier spent 53% of a
// catch-up in cuMemcpyHtoD waiting for each 256 KiB copy and the GPU work
// queued before it.)
//
// Apply runs for different sessions at once (the standby's receiver
// applies each session's records in a lane of its own): a record is
// applied under its session's lock, and what sessions share (images,
// tenants, the session table) is the node's, locked there. A replica
// session's context pipelines its launches as its primary's does
// (gpu.LaunchPipeliner), so a launch's failure shows at the stream's next
// synchronization on both nodes.
package replica

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/hypervisor/aperture"
	"github.com/vgpuha/vgpuha/hypervisor/exactlyonce"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/objects"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate/verify"
)

// Sessions is a node's sessions as the applier keeps them
// (hypervisor.Server).
type Sessions interface {
	// OpenReplica opens session id as a replica of the primary's whose
	// window is at base (an OpSessionOpen record's body).
	OpenReplica(id, base uint64, open []byte) error
	// Replica returns session id, or nil; Replicas every open session.
	Replica(id uint64) Session
	Replicas() []Session
	// CloseReplica frees a session (its primary closed it, or a reset).
	CloseReplica(Session)
	// ReceiveImage keeps an image the log carried (OpImage); ResetImages
	// drops them (OpReset).
	ReceiveImage(body []byte) error
	ResetImages()
	// Checksums describes every object (verify).
	Checksums() []verify.ObjectSum
	// ReplicaMetrics is where the applier counts.
	ReplicaMetrics() Metrics
}

// Metrics are the node's counters the applier adds to.
type Metrics struct {
	// ReadBackRepairs counts read-backs that found this replica's bytes
	// different from what the guest read on the primary.
	ReadBackRepairs prometheus.Counter
	// GlobalsElsewhere counts module variables the guest holds the address
	// of that lie at another address here than on the primary.
	GlobalsElsewhere prometheus.Counter
	// Panics counts panics recovered while applying, by record kind.
	Panics *prometheus.CounterVec
}

// Session is one replica session. sync.Locker is the session's own lock,
// which its requests take; the applier holds it around every other call.
type Session interface {
	sync.Locker
	ID() uint64
	// Closed: the session is being torn down.
	Closed() bool
	Memory() Memory
	Objects() *objects.Set
	Once() *exactlyonce.Table
	// Verify is the session's aperture comparisons (verify --apertures).
	Verify() *aperture.Comparisons
	// Run runs one guest request on the session, through its handler and
	// that handler's checks, as for a guest.
	Run(op abi.Opcode, req abi.Body) (abi.Body, error)
	// MarkUnsafe notes why the session's replica is not to be trusted
	// (the first reason stays) and returns the reason kept.
	MarkUnsafe(why string) string
	// Idle: no more records of the session for now; work it holds back
	// to batch goes on to the GPU. It locks the session itself.
	Idle()
}

// Memory is a replica session's device memory, in the guest's addresses.
type Memory interface {
	aperture.Device
	// Place makes the next allocation take addr (a resync placing it
	// where the primary had it), until Replayed.
	Place(addr uint64)
	// Prefault readies [addr, addr+n) for contents that follow.
	Prefault(addr, n uint64)
	// Translated: the window is not at the primary's base, so addresses
	// are translated.
	Translated() bool
	// Replaying says a record's request is being run (on) or is done
	// (off): with queue set, its host-to-device copies may stay queued.
	Replaying(on, queue bool)
	// Queued returns the context's queued copies, if it queues them.
	Queued() (gpu.QueuedCopier, bool)
}
