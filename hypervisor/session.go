package hypervisor

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vgpuha/vgpuha/handlemap"
	"github.com/vgpuha/vgpuha/hypervisor/exactlyonce"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/internal/guesterr"
	"github.com/vgpuha/vgpuha/kernels"
	"github.com/vgpuha/vgpuha/mmiotrace"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
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
	// tenant is who the session's memory and count belong to (tenant.go);
	// nil for a replica of a session opened by an older primary.
	tenant   *tenant
	tenantID string

	mu      sync.Mutex
	ctx     gpu.Context
	backend gpu.Backend // the server's; only described (OpDeviceInfo), never driven
	base    uint64      // window base the guest sees; the allocator works in these addresses
	size    uint64
	// delta is added to a guest address to get the backend's address: zero
	// when the backend placed the window where asked (identical addresses),
	// non-zero on a standby whose backend refused the base (translated).
	delta uint64
	// unsafe is set on a replica session that could not do what the
	// primary did (e.g. a kernel followed a guest pointer stored in memory
	// while addresses are translated): its replica is not to be trusted.
	unsafe string
	// record, when set, is told of every state change (the primary's
	// replication log). Called with mu held, in execution order.
	record *logHook
	// placed, when non-zero, is the address the next alloc must use (a
	// resync rebuilding an allocation where the primary had it).
	placed uint64
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

	ranges       handlemap.Ranges
	handles      *handlemap.Table
	kernels      map[handlemap.Handle]abi.KernelSpec // function handle -> declaration
	deferred     map[handlemap.Handle]error          // first error of async work per stream (0: null stream)
	moduleImages map[handlemap.Handle]*abi.ModuleImage
	requests     uint64
	// decoder decodes the session's requests (serve); footprint is
	// checkFootprint's buffer. Both are reused from request to request.
	decoder   abi.RequestDecoder
	footprint []kernels.Extent
	// inPlace is the data of the copy being run when it goes from the
	// guest's shared memory straight to the device (inplace.go).
	inPlace *abi.InPlace
	// replaying: a replicated record is being applied (Session.apply),
	// whose copies may stay queued (Server.QueueReplayedCopies).
	replaying bool
	// host is the host-memory region of the connection serving the
	// session, if it has one (hostmem.go).
	host *hostRegion

	// peerPID is the guest process on the other end of a unix socket (zero
	// otherwise); mmio holds its apertures (aperture.go).
	peerPID     int
	mmio        *sessionMMIO
	mmioMetrics *mmiotrace.Metrics
	// verifyMMIO: a standby's aperture comparisons for the verification
	// in progress (aperture.go), answered at its OpVerify.
	verifyMMIO *apertureVerify
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

// opTable is the hypervisor's half of abi's opcode table: the handler of
// every session request (every op abi does not mark Control; those are
// the connection's). What an op is (async, mutating, committing, its
// result and stream) is abi's row; handle and apply join the two.
var opTable = map[abi.Opcode]handler{
	abi.OpAlloc:            typed((*Session).alloc),
	abi.OpFree:             typed((*Session).free),
	abi.OpCopyHtoD:         typed((*Session).copyHtoD),
	abi.OpCopyDtoH:         typed((*Session).copyDtoH),
	abi.OpCopyDtoD:         typed((*Session).copyDtoD),
	abi.OpMemset:           typed((*Session).memset),
	abi.OpModuleLoad:       typed((*Session).moduleLoad),
	abi.OpModuleUnload:     typed((*Session).moduleUnload),
	abi.OpGetFunction:      typed((*Session).getFunction),
	abi.OpLaunch:           typed((*Session).launch),
	abi.OpStreamCreate:     typed((*Session).streamCreate),
	abi.OpStreamDestroy:    typed((*Session).streamDestroy),
	abi.OpStreamSync:       typed((*Session).streamSync),
	abi.OpSync:             typed((*Session).sync),
	abi.OpApertureAttach:   typed((*Session).apertureAttach),
	abi.OpDeviceInfo:       typed((*Session).deviceInfo),
	abi.OpFunctionParams:   typed((*Session).functionParams),
	abi.OpCopyHtoDHost:     typed((*Session).copyHtoDHost),
	abi.OpCopyDtoHHost:     typed((*Session).copyDtoHHost),
	abi.OpModuleGlobal:     typed((*Session).moduleGlobal),
	abi.OpGlobalWrite:      typed((*Session).globalWrite),
	abi.OpGlobalRead:       typed((*Session).globalRead),
	abi.OpModuleLoadCached: typed((*Session).moduleLoadCached),
}

// handle runs one decoded request and returns its reply body. With async
// set, an error is kept for the next synchronization and returned wrapped
// in deferredError (counted, not replied to).
//
// Every handler validates all of its arguments before it changes anything,
// so a refused request leaves the session as it was.
func (s *Session) handle(op abi.Opcode, reqID uint64, async bool, payload []byte) (abi.Body, error) {
	return s.serve(op, reqID, async, payload, nil)
}

// serve runs one request: payload is its body, or, with data set (an
// in-place copy, inplace.go), the copy's fixed fields, its data still in
// the memory the guest shares with the node.
func (s *Session) serve(op abi.Opcode, reqID uint64, async bool, payload []byte, data *abi.InPlace) (abi.Body, error) {
	run, info := opTable[op], op.Info()
	if run == nil {
		return nil, fail(abi.StatusInvalidValue, "%s is not a session request", op)
	}
	if async && !info.Async {
		return nil, fail(abi.StatusInvalidValue, "%s cannot be sent asynchronously", op)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var req abi.Body
	if data == nil {
		var err error
		if req, err = s.decoder.Decode(op, payload); err != nil {
			return nil, fail(abi.StatusInvalidValue, "%w", err)
		}
	}
	if err := s.admit(); err != nil {
		return nil, err
	}
	var in inPlaceCopy
	hostCopy := op == abi.OpCopyHtoDHost // still one after takeCopyData made it an OpCopyHtoD
	if data != nil || hostCopy && s.record != nil && s.host != nil {
		var err error
		if op, in, err = s.takeCopyData(op, req, payload, data); err != nil {
			return nil, err
		}
		defer in.done(s)
		run, req, payload = opTable[op], in.req, in.payload
	}
	if info.Mutates {
		// A host copy's content is where its data lies, not the data: no
		// checksum (as for a copy streamed from shared memory), also when
		// a replicated node read the data into its log record.
		if reply, err, done := s.once.Check(op, reqID, payload, in.streamed() || hostCopy); done {
			return reply, err
		}
	}
	reply, err := run(s, req)
	if info.Mutates && err == nil {
		s.once.NoteApplied(reqID, abi.ResultOf(reply))
	}
	if info.Mutates && s.record != nil {
		switch {
		case err == nil:
			s.record.append(replicate.Op(op), reqID, payload, abi.ResultOf(reply), 0, in.takeDraft())
		case info.RunsKernel && !isRefusal(err):
			// The kernel ran and faulted: it may have written memory
			// before it did, and the standby must run it too.
			s.record.append(replicate.Op(op), reqID, payload, 0, replicate.FlagFailed, nil)
		}
	}
	if err == nil && s.record != nil {
		s.recordReadBack(op, req, reply)
	}
	if err != nil && async {
		s.deferError(handlemap.Handle(abi.StreamOf(req)), err)
		return nil, deferredError{err}
	}
	return reply, err
}

// takeCopyData reads a copy's data from where the guest left it: the
// shared ring (an in-place copy, inplace.go) or, for a replicated session,
// its host-memory region (hostmem.go; the copy becomes an OpCopyHtoD). It
// returns the op to run and log.
// Precondition: s.mu must be locked.
func (s *Session) takeCopyData(op abi.Opcode, req abi.Body, fixed []byte, data *abi.InPlace) (abi.Opcode, inPlaceCopy, error) {
	if data != nil {
		in, err := s.takeInPlace(fixed, data)
		return op, in, err
	}
	in, err := s.takeHostCopy(req.(*abi.HostCopy))
	return abi.OpCopyHtoD, in, err
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

// dev translates a guest device address to the backend's.
func (s *Session) dev(addr uint64) uint64 { return addr + s.delta }

// attach marks the session served on a guest's connection, kept for
// grace once that ends. A guest drives the session: a context that can
// pipeline launches does from now on (a replica's context, applying a
// log, never does: gpu.LaunchPipeliner).
// Precondition: s.mu must be locked.
func (s *Session) attach(grace time.Duration) {
	s.attached, s.grace = true, grace
	s.stopGrace()
	if p, ok := s.ctx.(gpu.LaunchPipeliner); ok {
		p.PipelineLaunches()
	}
}

// Precondition: s.mu must be locked.
func (s *Session) deferError(stream handlemap.Handle, err error) {
	if _, seen := s.deferred[stream]; !seen {
		s.deferred[stream] = err
	}
}

// checkRange reports whether [addr, addr+n) lies inside one of this
// session's allocations. It is the isolation check: no request may name
// device memory the session did not allocate.
// Precondition: s.mu must be locked.
func (s *Session) checkRange(addr, n uint64, what string) error {
	if _, ok := s.ranges.Find(addr, n); !ok {
		return fail(abi.StatusOutOfRange, "%s: %d bytes at %#x are not inside one of this session's allocations", what, n, addr)
	}
	return nil
}

// Precondition: s.mu must be locked.
func (s *Session) stream(h uint64) (gpu.Stream, error) {
	if h == 0 {
		return 0, nil
	}
	b, err := s.handles.Lookup(handlemap.KindStream, handlemap.Handle(h))
	if err != nil {
		return 0, fail(abi.StatusInvalidHandle, "%w", err)
	}
	return gpu.Stream(b), nil
}

// Precondition: s.mu must be locked.
func (s *Session) checkObjects() error {
	if n := s.handles.Len() + s.ranges.Len(); n >= s.cfg.MaxObjects {
		return fail(abi.StatusOutOfMemory, "session holds %d objects, quota %d", n, s.cfg.MaxObjects)
	}
	return nil
}

func (s *Session) alloc(r *abi.Alloc) (abi.Body, error) {
	if r.Size == 0 {
		return nil, fail(abi.StatusInvalidValue, "alloc of zero bytes")
	}
	if r.Size > s.cfg.MemoryQuota-s.ranges.Total() {
		return nil, fail(abi.StatusOutOfMemory, "alloc of %d bytes exceeds the session quota (%d of %d bytes in use; --guest.memory-quota-bytes)",
			r.Size, s.ranges.Total(), s.cfg.MemoryQuota)
	}
	if err := s.checkObjects(); err != nil {
		return nil, err
	}
	addr, ok := s.ranges.FirstFit(s.base, s.size, r.Size, s.cfg.AllocAlign)
	if s.placed != 0 {
		addr, s.placed = s.placed, 0
		ok = addr >= s.base && r.Size <= s.size && addr-s.base <= s.size-r.Size
	}
	if !ok {
		return nil, fail(abi.StatusOutOfMemory, "no room for %d bytes in the session's %d-byte address window", r.Size, s.size)
	}
	if err := s.tenant.reserve(r.Size); err != nil {
		return nil, err
	}
	if err := s.ctx.Alloc(s.dev(addr), r.Size); err != nil {
		s.tenant.release(r.Size)
		return nil, err
	}
	if err := s.ranges.Insert(addr, r.Size); err != nil {
		return nil, fmt.Errorf("recording allocation: %w", err) // cannot happen: FirstFit chose a free range
	}
	return &abi.AllocReply{Ptr: addr}, nil
}

func (s *Session) free(r *abi.Free) (abi.Body, error) {
	if rg, ok := s.ranges.Find(r.Ptr, 0); !ok || rg.Addr != r.Ptr {
		return nil, fail(abi.StatusInvalidValue, "free: no allocation of this session starts at %#x", r.Ptr)
	}
	s.dropAperture(r.Ptr)
	if s.mmio != nil && len(s.mmio.apertures) == 0 {
		s.stopMMIO() // no aperture left: the guest runs untraced
	}
	if err := s.ctx.Free(s.dev(r.Ptr)); err != nil {
		return nil, err
	}
	if rg, ok := s.ranges.Remove(r.Ptr); ok {
		s.tenant.release(rg.Size)
	}
	return nil, nil
}

func (s *Session) copyHtoD(r *abi.CopyHtoD) (abi.Body, error) {
	st, err := s.stream(r.Stream)
	if err != nil {
		return nil, err
	}
	n := uint64(len(r.Data))
	if s.inPlace != nil {
		n = uint64(s.inPlace.Len())
	}
	if err := s.checkRange(r.Dst, n, "copy to device"); err != nil {
		return nil, err
	}
	if s.inPlace != nil {
		return nil, s.copyInPlace(s.dev(r.Dst), st)
	}
	if q, ok := s.ctx.(gpu.QueuedCopier); ok && s.replaying && s.srv.queueReplay.Load() {
		return nil, q.QueueCopyHtoD(s.dev(r.Dst), r.Data, st) // the record's body stays put until it is settled (Server.Mark, Settle)
	}
	return nil, s.ctx.CopyHtoD(s.dev(r.Dst), r.Data, st)
}

func (s *Session) copyDtoH(r *abi.CopyDtoH) (abi.Body, error) {
	st, err := s.stream(r.Stream)
	if err != nil {
		return nil, err
	}
	if limit := uint64(s.cfg.MaxPayload - 64); r.Size > limit {
		return nil, fail(abi.StatusInvalidValue, "copy from device of %d bytes exceeds the %d-byte reply limit", r.Size, limit)
	}
	if err := s.checkRange(r.Src, r.Size, "copy from device"); err != nil {
		return nil, err
	}
	buf := make([]byte, r.Size)
	if err := s.ctx.CopyDtoH(buf, s.dev(r.Src), st); err != nil {
		return nil, err
	}
	return &abi.DataReply{Data: buf}, nil
}

func (s *Session) copyDtoD(r *abi.CopyDtoD) (abi.Body, error) {
	st, err := s.stream(r.Stream)
	if err != nil {
		return nil, err
	}
	if err := s.checkRange(r.Src, r.Size, "device copy source"); err != nil {
		return nil, err
	}
	if err := s.checkRange(r.Dst, r.Size, "device copy destination"); err != nil {
		return nil, err
	}
	return nil, s.ctx.CopyDtoD(s.dev(r.Dst), s.dev(r.Src), r.Size, st)
}

func (s *Session) memset(r *abi.Memset) (abi.Body, error) {
	st, err := s.stream(r.Stream)
	if err != nil {
		return nil, err
	}
	if r.Width != 1 && r.Width != 2 && r.Width != 4 {
		return nil, fail(abi.StatusInvalidValue, "memset width %d (want 1, 2 or 4)", r.Width)
	}
	if r.Width < 4 && r.Value>>(8*r.Width) != 0 {
		return nil, fail(abi.StatusInvalidValue, "%d-bit memset of value %#x", 8*r.Width, r.Value)
	}
	if r.Count > s.size/uint64(r.Width) {
		return nil, fail(abi.StatusOutOfRange, "memset of %d elements is larger than the address window", r.Count)
	}
	if err := s.checkRange(r.Dst, r.Count*uint64(r.Width), "memset"); err != nil {
		return nil, err
	}
	return nil, s.ctx.Memset(s.dev(r.Dst), int(r.Width), r.Value, r.Count, st)
}

func (s *Session) moduleLoad(r *abi.ModuleLoad) (abi.Body, error) {
	img, err := abi.DecodeModuleImage(r.Image)
	if err != nil {
		return nil, fail(abi.StatusInvalidValue, "%w", err)
	}
	reply, err := s.loadImage(img)
	if err == nil {
		s.keepImage(r.Image, img)
	}
	return reply, err
}

// checkGuestKernels refuses a module with a kernel that is not the
// library's own (by name, signature and PTX) unless the node runs one guest
// per process (Config.GuestKernels): the library's kernels have their
// arguments checked, a guest's own kernel can dereference any address of
// the process's contexts, other sessions' included.
func (s *Session) checkGuestKernels(img *abi.ModuleImage) error {
	if s.cfg.GuestKernels {
		return nil
	}
	if img.Format != abi.FormatKernels {
		return fail(abi.StatusNotSupported, "a %v image holds the guest's own machine code; it needs a primary per guest "+
			"(--guest.kernels with --guest.max-sessions 1)", img.Format)
	}
	for _, spec := range img.Kernels {
		if !kernels.IsLibrary(spec) {
			return fail(abi.StatusNotSupported, "kernel %q is not a library kernel; guest-built kernels need a primary per guest "+
				"(--guest.kernels with --guest.max-sessions 1)", spec.Name)
		}
	}
	return nil
}

func (s *Session) moduleUnload(r *abi.ModuleUnload) (abi.Body, error) {
	h := handlemap.Handle(r.Module)
	m, err := s.handles.Lookup(handlemap.KindModule, h)
	if err != nil {
		return nil, fail(abi.StatusInvalidHandle, "%w", err)
	}
	if err := s.ctx.UnloadModule(gpu.Module(m)); err != nil {
		return nil, err
	}
	removed, _ := s.handles.Remove(handlemap.KindModule, h)
	for _, o := range removed {
		delete(s.kernels, o.Handle)
		delete(s.moduleImages, o.Handle)
	}
	return nil, nil
}

func (s *Session) getFunction(r *abi.GetFunction) (abi.Body, error) {
	mh := handlemap.Handle(r.Module)
	m, err := s.handles.Lookup(handlemap.KindModule, mh)
	if err != nil {
		return nil, fail(abi.StatusInvalidHandle, "%w", err)
	}
	img := s.moduleImages[mh]
	spec, ok := img.Kernel(r.Name)
	if !ok && img.Format == abi.FormatKernels {
		return nil, fail(abi.StatusInvalidValue, "module %d has no kernel %q", mh, r.Name)
	}
	if err := s.checkObjects(); err != nil {
		return nil, err
	}
	f, err := s.ctx.Function(gpu.Module(m), r.Name)
	if err != nil {
		return nil, err
	}
	if img.Format != abi.FormatKernels {
		if spec, err = s.rawKernel(f, r.Name); err != nil {
			return nil, err
		}
	}
	h, err := s.handles.Insert(handlemap.KindFunction, uint64(f), mh)
	if err != nil {
		return nil, err
	}
	s.kernels[h] = spec
	return &abi.HandleReply{Handle: uint64(h)}, nil
}

// rawKernel declares a function taken from a raw image: every parameter
// is bytes, in the slots the backend that loaded the image reports.
// Precondition: s.mu must be locked.
func (s *Session) rawKernel(f gpu.Function, name string) (abi.KernelSpec, error) {
	layouter, ok := s.ctx.(gpu.FunctionDescriber)
	if !ok {
		return abi.KernelSpec{}, fail(abi.StatusNotSupported, "this GPU cannot report kernel %q's parameters", name)
	}
	slots, err := layouter.ParamSlots(f)
	if err != nil {
		return abi.KernelSpec{}, err
	}
	spec := abi.KernelSpec{Name: name, Slots: slots, Params: make([]abi.ArgKind, len(slots))}
	for i := range spec.Params {
		spec.Params[i] = abi.ArgBytes
	}
	return spec, nil
}

// functionParams reports a function's parameter slots (empty for a kernel
// whose module declared its parameters) and, where the GPU gives them, its
// attributes.
func (s *Session) functionParams(r *abi.FunctionParams) (abi.Body, error) {
	fh := handlemap.Handle(r.Function)
	f, err := s.handles.Lookup(handlemap.KindFunction, fh)
	if err != nil {
		return nil, fail(abi.StatusInvalidHandle, "%w", err)
	}
	reply := &abi.FunctionParamsReply{Slots: s.kernels[fh].Slots}
	if d, ok := s.ctx.(gpu.FunctionDescriber); ok {
		if reply.Attrs, err = d.FunctionAttrs(gpu.Function(f)); err != nil {
			return nil, err
		}
	}
	return reply, nil
}

func checkDims(grid, block, cluster abi.Dim3, shared, sharedLimit uint32) error {
	if grid.Count() == 0 || block.Count() == 0 {
		return fail(abi.StatusInvalidValue, "launch with an empty grid %v or block %v", grid, block)
	}
	if block.Count() > gpu.MaxThreadsPerBlock || block.Z > gpu.MaxBlockZ {
		return fail(abi.StatusInvalidValue, "block %v exceeds %d threads", block, gpu.MaxThreadsPerBlock)
	}
	if grid.X > gpu.MaxGridX || grid.Y > gpu.MaxGridYZ || grid.Z > gpu.MaxGridYZ {
		return fail(abi.StatusInvalidValue, "grid %v exceeds the device's limits", grid)
	}
	if shared > sharedLimit {
		return fail(abi.StatusInvalidValue, "%d bytes of shared memory, limit %d", shared, sharedLimit)
	}
	if cluster == (abi.Dim3{}) {
		return nil
	}
	if cluster.Count() == 0 || cluster.Count() > gpu.MaxClusterBlocks ||
		grid.X%cluster.X != 0 || grid.Y%cluster.Y != 0 || grid.Z%cluster.Z != 0 {
		return fail(abi.StatusInvalidValue, "cluster %v: want at most %d blocks that divide grid %v", cluster, gpu.MaxClusterBlocks, grid)
	}
	return nil
}

// sharedLimit is the most dynamic shared memory a launch may ask for.
func (s *Session) sharedLimit() uint32 {
	if l, ok := s.backend.(gpu.SharedMemoryLimiter); ok {
		return max(l.MaxSharedBytesOptIn(), gpu.MaxSharedBytes)
	}
	return gpu.MaxSharedBytes
}

func (s *Session) launch(r *abi.Launch) (abi.Body, error) {
	fh := handlemap.Handle(r.Function)
	f, err := s.handles.Lookup(handlemap.KindFunction, fh)
	if err != nil {
		return nil, fail(abi.StatusInvalidHandle, "%w", err)
	}
	st, err := s.stream(r.Stream)
	if err != nil {
		return nil, err
	}
	if err := checkDims(r.Grid, r.Block, r.Cluster, r.SharedBytes, s.sharedLimit()); err != nil {
		return nil, err
	}
	spec := s.kernels[fh]
	if len(r.Args) != len(spec.Params) {
		return nil, fail(abi.StatusInvalidValue, "kernel %s takes %d arguments, launch gave %d", spec.Name, len(spec.Params), len(r.Args))
	}
	for i, a := range r.Args {
		if a.Kind != spec.Params[i] {
			return nil, fail(abi.StatusInvalidValue, "kernel %s argument %d: want kind %d, got %d", spec.Name, i, spec.Params[i], a.Kind)
		}
		if spec.Slots != nil && uint32(len(a.Raw)) != spec.Slots[i].Size {
			return nil, fail(abi.StatusInvalidValue, "kernel %s argument %d: %d bytes, the kernel takes %d", spec.Name, i, len(a.Raw), spec.Slots[i].Size)
		}
		if a.Kind == abi.ArgPtr && a.Bits != 0 {
			if _, ok := s.ranges.Find(a.Bits, 0); !ok { // the message only for a refusal: it costs more than the check
				return nil, s.checkRange(a.Bits, 0, fmt.Sprintf("kernel %s argument %d", spec.Name, i))
			}
		}
	}
	if err := s.checkFootprint(spec, r); err != nil {
		return nil, err
	}
	args := r.Args
	if s.delta != 0 { // pointer-typed arguments are translated; pointers stored in memory cannot be
		if why := untranslatable(spec); why != "" {
			return nil, fail(abi.StatusNotSupported, "kernel %s %s and this node's addresses differ from the primary's (by %#x): "+
				"its pointers cannot be translated; run each node in a process of its own, where windows get the same addresses",
				spec.Name, why, s.delta)
		}
		args = append([]abi.Arg(nil), r.Args...)
		for i := range args {
			if args[i].Kind == abi.ArgPtr && args[i].Bits != 0 {
				args[i].Bits = s.dev(args[i].Bits)
			}
		}
	}
	cfg := gpu.LaunchConfig{Grid: r.Grid, Block: r.Block, SharedBytes: r.SharedBytes, Cluster: r.Cluster}
	return nil, s.ctx.Launch(gpu.Function(f), cfg, args, st)
}

// untranslatable says why a kernel cannot run on a node whose addresses
// differ from the primary's ("" if it can): only pointer arguments are
// translated, so a guest's own kernel (its pointers are unknown) and a
// library kernel that follows pointers stored in memory (they are the
// primary's; on one GPU in one process they would reach the primary's
// memory) would reach the wrong memory, or none.
func untranslatable(spec abi.KernelSpec) string {
	k, ok := kernels.Lookup(spec.Name)
	switch {
	case !ok || !k.Matches(spec):
		return "is the guest's own"
	case k.FollowsPointers:
		return "follows pointers stored in device memory"
	}
	return ""
}

// checkFootprint checks, before any backend runs a library kernel, that
// all the memory the launch reaches through its pointer arguments lies in
// this session's allocations: a GPU runs the kernel's code unchecked. A
// kernel that follows pointers stored in memory reaches further than that,
// so it runs only where the backend checks every access or the process
// serves one guest (Config.GuestKernels). Guest-built kernels (allowed only
// with one guest per process) are not checked.
// Precondition: s.mu must be locked.
func (s *Session) checkFootprint(spec abi.KernelSpec, r *abi.Launch) error {
	k, ok := kernels.Lookup(spec.Name)
	if !ok || !k.Matches(spec) {
		return nil // a guest's own kernel: checkGuestKernels let it in
	}
	l := kernels.Launch{Grid: r.Grid, Block: r.Block, SharedBytes: r.SharedBytes, Args: r.Args}
	// A launch that would reach outside is refused before it runs, with
	// the status a GPU gives a kernel that faults (an illegal address).
	extents, err := k.Footprint(l, s.footprint)
	s.footprint = extents
	if err != nil {
		return fail(abi.StatusLaunchFailed, "%w", err)
	}
	for _, e := range extents {
		if _, ok := s.ranges.Find(r.Args[e.Arg].Bits, e.Bytes); e.Bytes != 0 && !ok {
			return fail(abi.StatusLaunchFailed, "kernel %s: %s: %d bytes at %#x are not inside one of this session's allocations",
				spec.Name, e.What, e.Bytes, r.Args[e.Arg].Bits)
		}
	}
	if checker, ok := s.backend.(gpu.AccessChecker); k.FollowsPointers && !s.cfg.GuestKernels && (!ok || !checker.ChecksEveryAccess()) {
		return fail(abi.StatusNotSupported, "kernel %s follows pointers stored in device memory, which this GPU does not check; "+
			"it needs a primary per guest (--guest.kernels with --guest.max-sessions 1)", spec.Name)
	}
	return nil
}

func (s *Session) streamCreate(*abi.StreamCreate) (abi.Body, error) {
	if err := s.checkObjects(); err != nil {
		return nil, err
	}
	st, err := s.ctx.CreateStream()
	if err != nil {
		return nil, err
	}
	h, err := s.handles.Insert(handlemap.KindStream, uint64(st), 0)
	if err != nil {
		return nil, err
	}
	return &abi.HandleReply{Handle: uint64(h)}, nil
}

func (s *Session) streamDestroy(r *abi.StreamDestroy) (abi.Body, error) {
	if r.Stream == 0 {
		return nil, fail(abi.StatusInvalidHandle, "the null stream cannot be destroyed")
	}
	st, err := s.stream(r.Stream)
	if err != nil {
		return nil, err
	}
	if err := s.ctx.DestroyStream(st); err != nil {
		return nil, err
	}
	s.handles.Remove(handlemap.KindStream, handlemap.Handle(r.Stream))
	delete(s.deferred, handlemap.Handle(r.Stream))
	return nil, nil
}

func (s *Session) streamSync(r *abi.StreamSync) (abi.Body, error) {
	st, err := s.stream(r.Stream)
	if err != nil {
		return nil, err
	}
	if err := s.ctx.SyncStream(st); err != nil {
		return nil, err
	}
	h := handlemap.Handle(r.Stream)
	if err := s.deferred[h]; err != nil {
		delete(s.deferred, h)
		return nil, err
	}
	return nil, nil
}

// deviceInfo describes the backend's device (the guest keeps it, so every
// node of a pair must describe the same kind of device).
func (s *Session) deviceInfo(*abi.DeviceInfo) (abi.Body, error) {
	d, ok := s.backend.(gpu.DeviceDescriber)
	if !ok {
		return nil, fail(abi.StatusNotSupported, "the %s backend cannot describe its device", s.backend.Name())
	}
	info, err := d.DeviceInfo()
	if err != nil {
		return nil, err
	}
	return &info, nil
}

func (s *Session) sync(*abi.Sync) (abi.Body, error) {
	if err := s.ctx.Sync(); err != nil {
		return nil, err
	}
	var first error
	var firstStream handlemap.Handle
	for h, err := range s.deferred {
		if first == nil || h < firstStream {
			first, firstStream = err, h
		}
	}
	clear(s.deferred)
	return nil, first
}
