package abi

import "fmt"

// Opcode names a guest request. Zero is invalid so that a zeroed or
// truncated buffer can never be mistaken for a request.
type Opcode uint16

// Opcodes of this ABI version. New opcodes are appended, never renumbered,
// and each gets a row in opTable.
const (
	OpInvalid Opcode = iota
	OpHello
	OpAlloc
	OpFree
	OpCopyHtoD
	OpCopyDtoH
	OpCopyDtoD
	OpMemset
	OpModuleLoad
	OpModuleUnload
	OpGetFunction
	OpLaunch
	OpStreamCreate
	OpStreamDestroy
	OpStreamSync
	OpSync
	// OpReject answers a frame the hypervisor could not parse far enough to
	// know its opcode. It is only ever sent as a reply.
	OpReject
	// OpBye ends a session on purpose: the node frees it at once instead of
	// keeping it for a resume. Sent async it has no reply; sent as a call
	// it is answered once the session is freed (its slot is free for the
	// next guest), and the node then ends the connection.
	OpBye
	// OpApertureAttach makes a memory file the guest maps the contents of
	// one of its allocations (an aperture, written directly by the guest).
	OpApertureAttach
	// OpDeviceInfo describes the node's device (name, memory, attributes):
	// a guest takes it once, at session start, and keeps it, so a failover
	// changes nothing it reports.
	OpDeviceInfo
	// OpFunctionParams reports where each parameter of a function taken
	// from a raw (cubin or fatbin) image lives in its parameter buffer, as
	// the backend that loaded the image says: the guest marshals launch
	// arguments by it.
	OpFunctionParams
	// OpCopyHtoDHost and OpCopyDtoHHost copy between device memory and
	// the connection's host-memory region (hostmem.go).
	OpCopyHtoDHost
	OpCopyDtoHHost
	// OpModuleGlobal, OpGlobalWrite and OpGlobalRead find and copy a
	// module's variables by name (globals.go).
	OpModuleGlobal
	OpGlobalWrite
	OpGlobalRead
	// OpModuleLoadCached loads a module image the node already holds, named
	// by its content's hash (images.go), without sending its bytes.
	OpModuleLoadCached
	// OpAddressReserve, OpAddressFree, OpMemMap and OpMemUnmap reserve
	// ranges of the window and map device memory in them (vmm.go).
	OpAddressReserve
	OpAddressFree
	OpMemMap
	OpMemUnmap
	// OpTensorMapEncode has the node's GPU driver encode a tensor map
	// (tensormap.go).
	OpTensorMapEncode
	// OpImageStage carries one piece of a module image too large for one
	// frame into the session (images.go); a load by hash then loads it.
	OpImageStage
	// OpOccupancy asks the node's GPU driver an occupancy question
	// (occupancy.go).
	OpOccupancy
	// OpDeviceStatus reports the live state of the node's device
	// (devstatus.go): what the guest's NVML answers. Neither logged nor
	// replicated; after a failover it is the new node's device's.
	OpDeviceStatus
	// OpStatusHello opens a status connection instead of a session
	// (devstatus.go): it answers device_info and device_status only,
	// holds no GPU context and takes no session slot.
	OpStatusHello
	opLimit
)

// OpInfo is everything the project knows about one opcode: a row of
// opTable. The guest driver, the hypervisor's dispatch and the standby's
// apply path all read these rows instead of listing opcodes themselves.
type OpInfo struct {
	Name string
	// NewRequest returns an empty request body to decode into.
	NewRequest func() Body
	// NewReply returns an empty body of a successful reply; nil when the
	// reply carries only a status.
	NewReply func() Body
	// Control: the op opens, ends or refuses a connection's session
	// (hello, bye, reject) or opens a status connection (status_hello).
	// The connection answers it, not a session.
	Control bool
	// Async: the guest driver pipelines it (FlagAsync): no reply, and an
	// error it causes is reported by the next synchronization.
	Async bool
	// Mutates: it changes device state, so it is logged, replicated to the
	// standby, and applied exactly once across a failover.
	Mutates bool
	// Commits: a successful reply is a commit point. Under the commit
	// replication mode it is sent only once the standby has applied every
	// request before it, because it carries something out to the guest
	// (data, an address, a handle, a completed sync). A guest driver may
	// forget requests older than a commit point; it must keep the others
	// to resend after a failover. (Error replies are commit points too,
	// for any op.)
	Commits bool
	// RunsKernel: it runs guest kernel code, which may write device memory
	// before it faults. A backend failure is therefore replicated too (the
	// standby must fail the same way), and a replica whose addresses are
	// translated cannot follow device pointers the kernel reads from memory.
	RunsKernel bool
	// Result is the value a successful reply hands the guest that the
	// standby must reproduce and a resent request must get again (its reply
	// body's ResultReply.Result); NoResult for none.
	Result ResultKind
}

// ResultKind says what an op's result is.
type ResultKind uint8

const (
	// NoResult: the reply hands the guest nothing a replay must reproduce.
	NoResult ResultKind = iota
	// ResultAddress: a device address the session's allocator chose
	// (AllocReply.Ptr).
	ResultAddress
	// ResultHandle: a new guest handle of a module, function or stream
	// (HandleReply.Handle).
	ResultHandle
)

// ResultReply is a reply body that carries its op's result (OpInfo.Result).
type ResultReply interface {
	Body
	Result() uint64
	setResult(uint64)
}

// StreamRequest is a request queued on a stream (zero: the null stream):
// an async one's error is reported by that stream's next synchronization.
type StreamRequest interface {
	Body
	OnStream() uint64
}

// opTable is the one list of opcodes and what they are.
var opTable = [opLimit]OpInfo{
	OpInvalid: {Name: "invalid"},
	OpHello:   {Name: "hello", NewRequest: newBody[Hello], NewReply: newBody[HelloReply], Control: true, Commits: true},
	OpAlloc: {Name: "alloc", NewRequest: newBody[Alloc], NewReply: newBody[AllocReply],
		Mutates: true, Commits: true, Result: ResultAddress},
	OpFree:     {Name: "free", NewRequest: newBody[Free], Mutates: true},
	OpCopyHtoD: {Name: "copy_htod", NewRequest: newBody[CopyHtoD], Async: true, Mutates: true},
	OpCopyDtoH: {Name: "copy_dtoh", NewRequest: newBody[CopyDtoH], NewReply: newBody[DataReply], Commits: true},
	OpCopyDtoD: {Name: "copy_dtod", NewRequest: newBody[CopyDtoD], Async: true, Mutates: true},
	OpMemset:   {Name: "memset", NewRequest: newBody[Memset], Async: true, Mutates: true},
	OpModuleLoad: {Name: "module_load", NewRequest: newBody[ModuleLoad], NewReply: newBody[HandleReply],
		Mutates: true, Commits: true, Result: ResultHandle},
	OpModuleUnload: {Name: "module_unload", NewRequest: newBody[ModuleUnload], Mutates: true},
	OpGetFunction: {Name: "get_function", NewRequest: newBody[GetFunction], NewReply: newBody[HandleReply],
		Mutates: true, Commits: true, Result: ResultHandle},
	OpLaunch: {Name: "launch", NewRequest: newBody[Launch], Async: true, Mutates: true, RunsKernel: true},
	OpStreamCreate: {Name: "stream_create", NewRequest: newBody[StreamCreate], NewReply: newBody[HandleReply],
		Mutates: true, Commits: true, Result: ResultHandle},
	OpStreamDestroy: {Name: "stream_destroy", NewRequest: newBody[StreamDestroy], Mutates: true},
	OpStreamSync:    {Name: "stream_sync", NewRequest: newBody[StreamSync], Commits: true},
	OpSync:          {Name: "sync", NewRequest: newBody[Sync], Commits: true},
	OpReject:        {Name: "reject", NewRequest: newBody[Reject], Control: true},
	OpBye:           {Name: "bye", NewRequest: newBody[Bye], Control: true, Async: true},
	OpApertureAttach: {Name: "aperture_attach", NewRequest: newBody[ApertureAttach], NewReply: newBody[ApertureReply],
		Commits: true},
	OpDeviceInfo: {Name: "device_info", NewRequest: newBody[DeviceInfo], NewReply: newBody[DeviceInfoReply], Commits: true},
	OpFunctionParams: {Name: "function_params", NewRequest: newBody[FunctionParams], NewReply: newBody[FunctionParamsReply],
		Commits: true},
	OpCopyHtoDHost: {Name: "copy_htod_hostmem", NewRequest: newBody[HostCopy], Mutates: true, Commits: true},
	OpCopyDtoHHost: {Name: "copy_dtoh_hostmem", NewRequest: newBody[HostCopy], Commits: true},
	OpModuleGlobal: {Name: "module_global", NewRequest: newBody[ModuleGlobal], NewReply: newBody[GlobalReply], Commits: true},
	OpGlobalWrite:  {Name: "global_write", NewRequest: newBody[GlobalWrite], Mutates: true},
	OpGlobalRead:   {Name: "global_read", NewRequest: newBody[GlobalRead], NewReply: newBody[DataReply], Commits: true},
	OpModuleLoadCached: {Name: "module_load_cached", NewRequest: newBody[ModuleLoadCached], NewReply: newBody[HandleReply],
		Mutates: true, Commits: true, Result: ResultHandle},
	OpAddressReserve: {Name: "address_reserve", NewRequest: newBody[AddressReserve], NewReply: newBody[AllocReply],
		Mutates: true, Commits: true, Result: ResultAddress},
	OpAddressFree:     {Name: "address_free", NewRequest: newBody[AddressFree], Mutates: true},
	OpMemMap:          {Name: "mem_map", NewRequest: newBody[MemMap], Mutates: true},
	OpMemUnmap:        {Name: "mem_unmap", NewRequest: newBody[MemUnmap], Mutates: true},
	OpTensorMapEncode: {Name: "tensor_map_encode", NewRequest: newBody[TensorMapEncode], NewReply: newBody[TensorMapReply]},
	OpImageStage:      {Name: "image_stage", NewRequest: newBody[ImageStage], Mutates: true},
	OpOccupancy:       {Name: "occupancy", NewRequest: newBody[Occupancy], NewReply: newBody[OccupancyReply]},
	OpDeviceStatus:    {Name: "device_status", NewRequest: newBody[DeviceStatus], NewReply: newBody[DeviceStatusReply]},
	OpStatusHello: {Name: "status_hello", NewRequest: newBody[StatusHello], NewReply: newBody[StatusHelloReply],
		Control: true},
}

// newBody is the constructor of an empty body of type T.
func newBody[T any, PT interface {
	*T
	Body
}]() Body {
	return PT(new(T))
}

// Info is op's row of the opcode table; the zero OpInfo for an opcode
// this version does not define.
func (op Opcode) Info() OpInfo {
	if op < opLimit {
		return opTable[op]
	}
	return OpInfo{}
}

// Valid reports whether op is a defined, non-zero opcode.
func (op Opcode) Valid() bool { return op > OpInvalid && op < opLimit }

func (op Opcode) String() string {
	if op < opLimit {
		return opTable[op].Name
	}
	return fmt.Sprintf("op(%d)", uint16(op))
}

// Opcodes lists every valid opcode, in numeric order.
func Opcodes() []Opcode {
	ops := make([]Opcode, 0, opLimit-1)
	for op := OpInvalid + 1; op < opLimit; op++ {
		ops = append(ops, op)
	}
	return ops
}

// NewRequest returns an empty request body for op, or nil for an invalid op.
func NewRequest(op Opcode) Body {
	if newReq := op.Info().NewRequest; newReq != nil {
		return newReq()
	}
	return nil
}

// DecodeRequest decodes the body of a request frame.
func DecodeRequest(op Opcode, payload []byte) (Body, error) {
	return new(RequestDecoder).Decode(op, payload)
}

// RequestDecoder decodes request bodies as DecodeRequest does, keeping its
// decoder from one request to the next: a server decoding a request per
// call saves an allocation each. One goroutine at a time may use it.
type RequestDecoder struct{ d Decoder }

// Decode decodes the body of a request frame of op.
func (r *RequestDecoder) Decode(op Opcode, payload []byte) (Body, error) {
	m := NewRequest(op)
	if m == nil {
		return nil, fmt.Errorf("%w %d", ErrBadOpcode, uint16(op))
	}
	r.d = Decoder{b: payload}
	m.decode(&r.d)
	err := r.d.Finish()
	r.d = Decoder{} // holds on to no payload
	if err != nil {
		return nil, fmt.Errorf("decoding %s: %w", op, err)
	}
	return m, nil
}

// ResultOf is the result a reply carries (see OpInfo.Result), or zero.
func ResultOf(reply Body) uint64 {
	if r, ok := reply.(ResultReply); ok {
		return r.Result()
	}
	return 0
}

// ReplayReply rebuilds the successful reply to an already applied request
// from its recorded result: what a resent request gets instead of running
// twice. It is nil for an op whose reply carries only a status.
func (info OpInfo) ReplayReply(result uint64) Body {
	if info.Result == NoResult {
		return nil
	}
	r := info.NewReply().(ResultReply)
	r.setResult(result)
	return r
}

// StreamOf is the stream a request is queued on; zero for the null stream
// and for requests that are not queued on one.
func StreamOf(req Body) uint64 {
	if r, ok := req.(StreamRequest); ok {
		return r.OnStream()
	}
	return 0
}

// Results and streams of the bodies that have them.

func (r *AllocReply) Result() uint64      { return r.Ptr }
func (r *AllocReply) setResult(v uint64)  { r.Ptr = v }
func (r *HandleReply) Result() uint64     { return r.Handle }
func (r *HandleReply) setResult(v uint64) { r.Handle = v }
func (m *CopyHtoD) OnStream() uint64      { return m.Stream }
func (m *CopyDtoH) OnStream() uint64      { return m.Stream }
func (m *CopyDtoD) OnStream() uint64      { return m.Stream }
func (m *Memset) OnStream() uint64        { return m.Stream }
func (m *Launch) OnStream() uint64        { return m.Stream }
