package hypervisor

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/vgpuha/vgpuha/handlemap"
	"github.com/vgpuha/vgpuha/hypervisor/aperture"
	"github.com/vgpuha/vgpuha/hypervisor/devmem"
	"github.com/vgpuha/vgpuha/hypervisor/exactlyonce"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/guestconn"
	"github.com/vgpuha/vgpuha/hypervisor/internal/guesterr"
	"github.com/vgpuha/vgpuha/hypervisor/objects"
	"github.com/vgpuha/vgpuha/hypervisor/tenancy"
	"github.com/vgpuha/vgpuha/mmiotrace"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Session is one guest's connection to the GPU: its own backend context, its
// own device-address window, its handles and its quota. Nothing in a session
// refers to another session's objects, which is what keeps guests apart.
//
// Lock order: Server.mu before Session.mu. Requests hold mu while they run;
// status readers take it briefly.
type Session struct {
	id     uint64
	guest  string
	token  []byte // resume token (token.go): a secret, never shown
	slot   int
	cfg    Config
	fenced *atomic.Bool // the server's: set, this node no longer executes anything
	srv    *Server      // for logging and counting what guard.go recovers from
	// tenant is who the session's memory and count belong to (package tenancy);
	// nil for a replica of a session opened by an older primary.
	tenant   *tenancy.Tenant
	tenantID string
	// dev is the GPU the session was placed on, for its whole life
	// (devices.go); pin the GPU its guest asked for, if any.
	dev *device
	pin string
	// shown is the index of the GPU whose identity the guest sees (the
	// one the session was first placed on, on whichever node: the
	// session-open record carries it; identity.go).
	shown int

	mu  sync.Mutex
	ctx gpu.Context
	// loggedTensorMap: the node said once that the guest encodes tensor
	// maps over module variables (replication.go).
	loggedTensorMap bool
	// mem is the session's device memory (package devmem); objs its
	// modules, functions and streams (package objects).
	mem  *devmem.Memory
	objs *objects.Set
	// unsafe is set on a replica session that could not do what the
	// primary did (e.g. a kernel followed a guest pointer stored in memory
	// while addresses are translated): its replica is not to be trusted.
	unsafe string
	// record, when set, is told of every state change (the primary's
	// replication log). Called with mu held, in execution order.
	record *logHook
	// closed: the session is being torn down; snapshots skip it.
	closed bool
	// attached: a guest connection serves this session. A replica session
	// is unattached until its guest resumes it after a failover.
	attached bool
	// grace is how long the session outlives a dropped connection, for its
	// guest to resume it (a network blip must not cost the GPU state).
	// kept: it does so now, counted in its tenant's detached sessions.
	grace time.Duration
	kept  bool
	// detachedAt is when this node began to keep the session without a
	// connection (its connection ended here, or this node began to serve
	// with the session unattached); it is freed at expires unless resumed,
	// and expiry wakes the server then (lifetime.go). All zero while a
	// connection serves it, and on a standby, whose primary owns its clock.
	detachedAt, expires time.Time
	expiry              *time.Timer
	// once answers a request resent after a failover from the session's
	// state instead of running it twice (package exactlyonce).
	once exactlyonce.Table
	// failed says why the session stopped serving (a request panicked
	// while it changed state, which may be torn); see guard.go.
	failed string

	requests uint64
	// decoder decodes the session's requests (serve), reused from request
	// to request.
	decoder abi.RequestDecoder

	// peerPID is the guest process on the other end of a unix socket (zero
	// otherwise); mmio holds its apertures (package aperture).
	peerPID     int
	mmio        *aperture.Set
	mmioMetrics *mmiotrace.Metrics
	// verifyMMIO: a standby's aperture comparisons for the verification
	// in progress, answered at its OpVerify.
	verifyMMIO aperture.Comparisons
}

// fail, statusOf and isRefusal are guesterr's: a request failure carries
// the status the guest sees.
var (
	fail      = guesterr.Fail
	statusOf  = guesterr.StatusOf
	isRefusal = guesterr.IsRefusal
)

// handler runs one decoded request of a session and returns its reply
// body (whose type is the op's abi.OpInfo.NewReply).
type handler func(s *Session, req abi.Body) (abi.Body, error)

// typed adapts a handler for one request type to handler.
func typed[T abi.Body](fn func(*Session, T) (abi.Body, error)) handler {
	return func(s *Session, b abi.Body) (abi.Body, error) { return fn(s, b.(T)) }
}

// onMemory adapts a handler of the session's memory (package devmem).
func onMemory[T abi.Body](fn func(*devmem.Memory, T) (abi.Body, error)) handler {
	return func(s *Session, b abi.Body) (abi.Body, error) { return fn(s.mem, b.(T)) }
}

// onObjects adapts a handler of the session's objects (package objects).
func onObjects[T abi.Body](fn func(*objects.Set, T) (abi.Body, error)) handler {
	return func(s *Session, b abi.Body) (abi.Body, error) { return fn(s.objs, b.(T)) }
}

// opTable is the hypervisor's half of abi's opcode table: the handler of
// every session request (every op abi does not mark Control; those are
// the connection's). What an op is (async, mutating, committing, its
// result and stream) is abi's row; Serve and the replica's applier join
// the two.
var opTable = map[abi.Opcode]handler{
	abi.OpAlloc:            onMemory((*devmem.Memory).Alloc),
	abi.OpFree:             typed((*Session).free),
	abi.OpCopyHtoD:         onMemory((*devmem.Memory).CopyHtoD),
	abi.OpCopyDtoH:         onMemory((*devmem.Memory).CopyDtoH),
	abi.OpCopyDtoD:         onMemory((*devmem.Memory).CopyDtoD),
	abi.OpMemset:           onMemory((*devmem.Memory).Memset),
	abi.OpModuleLoad:       onObjects((*objects.Set).ModuleLoad),
	abi.OpModuleUnload:     onObjects((*objects.Set).ModuleUnload),
	abi.OpGetFunction:      onObjects((*objects.Set).GetFunction),
	abi.OpLaunch:           onObjects((*objects.Set).Launch),
	abi.OpStreamCreate:     onObjects((*objects.Set).StreamCreate),
	abi.OpStreamDestroy:    onObjects((*objects.Set).StreamDestroy),
	abi.OpStreamSync:       onObjects((*objects.Set).StreamSync),
	abi.OpSync:             onObjects((*objects.Set).Sync),
	abi.OpApertureAttach:   typed((*Session).apertureAttach),
	abi.OpDeviceInfo:       typed((*Session).deviceInfo),
	abi.OpFunctionParams:   onObjects((*objects.Set).FunctionParams),
	abi.OpCopyHtoDHost:     onMemory((*devmem.Memory).CopyHtoDHost),
	abi.OpCopyDtoHHost:     onMemory((*devmem.Memory).CopyDtoHHost),
	abi.OpModuleGlobal:     onObjects((*objects.Set).ModuleGlobal),
	abi.OpGlobalWrite:      onObjects((*objects.Set).GlobalWrite),
	abi.OpGlobalRead:       onObjects((*objects.Set).GlobalRead),
	abi.OpModuleLoadCached: onObjects((*objects.Set).ModuleLoadCached),
	abi.OpAddressReserve:   onMemory((*devmem.Memory).AddressReserve),
	abi.OpAddressFree:      onMemory((*devmem.Memory).AddressFree),
	abi.OpMemMap:           onMemory((*devmem.Memory).MemMap),
	abi.OpMemUnmap:         onMemory((*devmem.Memory).MemUnmap),
	abi.OpTensorMapEncode:  onObjects((*objects.Set).TensorMapEncode),
	abi.OpOccupancy:        onObjects((*objects.Set).Occupancy),
	abi.OpImageStage:       onObjects((*objects.Set).ImageStage),
	abi.OpDeviceStatus:     typed((*Session).deviceStatus),
}

// Serve runs one request (guestconn.Session) and returns its reply body.
// With async set, an error is kept for the next synchronization and
// returned wrapped in guesterr.Deferred (counted, not replied to).
//
// Every handler validates all of its arguments before it changes anything,
// so a refused request leaves the session as it was.
func (s *Session) Serve(r guestconn.Request) (abi.Body, error) {
	op, payload := r.Op, r.Payload
	info := op.Info()
	if opTable[op] == nil {
		return nil, fail(abi.StatusInvalidValue, "%s is not a session request", op)
	}
	if r.Async && !info.Async {
		return nil, fail(abi.StatusInvalidValue, "%s cannot be sent asynchronously", op)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	run := s.handlerOf(op)
	var req abi.Body
	if _, ring := r.Src.(guestconn.Ring); !ring {
		var err error
		if req, err = s.decoder.Decode(op, payload); err != nil {
			return nil, fail(abi.StatusInvalidValue, "%w", err)
		}
	}
	if err := s.admit(); err != nil {
		return nil, err
	}
	// A host copy's content is where its data lies, not the data: no
	// checksum (as for a copy streamed from shared memory), also when a
	// replicated node read the data into its log record.
	summed := op != abi.OpCopyHtoDHost
	var in inPlaceCopy
	if r.Src != nil {
		var err error
		if in, err = s.takeCopy(r.Src, req); err != nil {
			return nil, err
		}
		defer in.done(s)
		req, summed = in.req, summed && !in.direct
		if !in.direct { // the bytes were read into a copy_htod body: it runs, and is logged, as one
			op, run, payload = abi.OpCopyHtoD, opTable[abi.OpCopyHtoD], in.payload
		}
	}
	sum := contentSum(r, payload, summed && info.Mutates)
	if info.Mutates {
		if reply, err, done := s.once.Check(op, r.ID, sum, !summed); done {
			return s.answerResend(r, req, reply, err)
		}
	}
	reporting := s.failuresToReport(info)
	reply, err := run(s, req)
	var failure *exactlyonce.Failure
	if info.Mutates {
		failure = s.noteOutcome(op, r, req, reply, err)
	}
	if s.record != nil {
		s.record.request(op, info, r.ID, payload, sum, req, reply, err, &in)
		if err == nil {
			s.recordReadBack(op, req, reply)
			s.recordGlobalAddr(op, req, reply)
			s.recordTensorMap(op, reply)
		}
		s.record.outcome(r.ID, failure, reporting, s.objs)
	}
	if err != nil && r.Async {
		s.objs.DeferError(handlemap.Handle(abi.StreamOf(req)), err)
		return nil, guesterr.Deferred{Err: err}
	}
	return reply, err
}

// contentSum is exactly-once's sum of a request's payload where want says
// one is kept (and the request has an id): the frame reader's, where the
// frame holds the whole request (no Src: payload is then the frame's) and
// the reader summed it on the way in (a large copy_htod's: a pass over
// its bytes saved), else computed here.
func contentSum(r guestconn.Request, payload []byte, want bool) uint32 {
	switch {
	case !want || r.ID == 0:
		return 0
	case r.Summed && r.Src == nil:
		return r.Sum
	}
	return exactlyonce.Sum(payload)
}

// admit refuses a request the session must not run now, and otherwise
// counts it and flushes the guest's aperture writes before it.
// Precondition: s.mu must be locked.
func (s *Session) admit() error {
	if s.fenced.Load() {
		return fail(abi.StatusDeposed, "deposed: this node was fenced; the session continues on the node that took over")
	}
	if s.srv.leaseExpired() {
		return errLeaseExpired()
	}
	if s.failed != "" {
		return fail(abi.StatusInternal, "session %d has failed (%s); open a new session", s.id, s.failed)
	}
	s.requests++
	// Everything the guest wrote to its apertures before this call reaches
	// the device and the log first (program order).
	if err := s.flushMMIO(); err != nil {
		return fail(abi.StatusInternal, "flushing aperture writes: %w", err)
	}
	return nil
}

// attach marks the session served on a guest's connection, kept for
// grace once that ends. A guest drives the session: a context that can
// pipeline launches does from now on (gpu.LaunchPipeliner; a replica's
// context already did since it opened).
// Precondition: s.mu must be locked.
func (s *Session) attach(grace time.Duration) {
	s.attached, s.grace = true, grace
	s.stopGrace()
	s.pipeline()
}

// pipeline has the session's context pipeline launches and, where it can,
// batch them (gpu.LaunchPipeliner, LaunchBatcher): its driver (a guest's
// connection, a standby's lane) calls Idle when it has nothing more.
// Precondition: s.mu must be locked.
func (s *Session) pipeline() {
	if p, ok := s.ctx.(gpu.LaunchPipeliner); ok {
		p.PipelineLaunches()
	}
	if b, ok := s.ctx.(gpu.LaunchBatcher); ok {
		b.BatchLaunches()
	}
}

func (s *Session) free(r *abi.Free) (abi.Body, error) {
	if _, ok := s.mem.Allocation(r.Ptr); !ok || s.mem.Mapped(r.Ptr) {
		return nil, fail(abi.StatusInvalidValue, "free: no allocation of this session starts at %#x (a mapping is unmapped, not freed)", r.Ptr)
	}
	if s.mmio != nil {
		s.mmio.Drop(r.Ptr)
		if s.mmio.Len() == 0 {
			s.stopMMIO() // no aperture left: the guest runs untraced
		}
	}
	return nil, s.mem.Free(r.Ptr)
}

// deviceInfo describes the node's device (status.go).
func (s *Session) deviceInfo(*abi.DeviceInfo) (abi.Body, error) {
	return s.srv.deviceInfo(s.dev, s.shown)
}

// deviceStatus reports the device's live state and the memory the guest
// holds: its tenant's sessions together and this session (status.go).
func (s *Session) deviceStatus(*abi.DeviceStatus) (abi.Body, error) {
	session := s.mem.Bytes()
	if s.tenant == nil {
		return s.srv.deviceStatus(s.dev, session, &session, 0, false), nil
	}
	return s.srv.deviceStatus(s.dev, max(s.tenant.Held(), session), &session, s.tenant.Quota.Memory, true), nil
}
