package abi

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
)

// Limits on request fields, checked by the decoders.
const (
	MaxNameLen = 256 // guest names
	// MaxKernelName bounds a kernel's (mangled) name: C++ templates give
	// long ones (PyTorch's run to a few thousand bytes).
	MaxKernelName = 16 << 10
	MaxArgs       = 64   // kernel arguments per launch
	MaxParamBytes = 4096 // total bytes of kernel arguments, as in CUDA
	// MaxModuleImage bounds a module image: one frame's payload less room
	// for the request around it. The largest fatbins of PyTorch 2.11's CUDA
	// 13 libraries are 4.6 MiB (cuBLAS), 6.0 (cuBLASLt), 6.6 (libtorch_cuda)
	// and 6.9 (cuDNN); NCCL's one 56 MiB image is beyond it.
	MaxModuleImage = 15 << 20
)

// Body is a request or reply body. Append encodes it; decode reads it back
// from a Decoder, which records the first error.
type Body interface {
	Append(b []byte) []byte
	decode(d *Decoder)
}

// Unmarshal decodes b into m, refusing short and over-long input.
func Unmarshal(b []byte, m Body) error {
	d := Decoder{b: b}
	m.decode(&d)
	return d.Finish()
}

// Hello opens or resumes a session. Resume is zero for a new session.
type Hello struct {
	GuestName string
	Resume    uint64
	// GraceMS asks the node to keep the session this long after the
	// connection drops, so the guest can resume it (zero: free at once).
	// The node may grant less.
	GraceMS uint32
	// Token proves a resume: the session's resume token from the reply
	// that opened it (version 2; empty or ResumeTokenSize bytes). A
	// session cannot be resumed without it.
	Token []byte
	// GPU pins a new session to one of the node's GPUs: its index or
	// UUID (the guest library's VGPUHA_GPU; empty: the node places it).
	// It follows a token field (zeros when there is none), so a node
	// that knows no pin refuses a pinned hello rather than ignore it.
	GPU string
}

// MaxGPUPinLen bounds Hello.GPU: an index, or a UUID as nvidia-smi
// prints it.
const MaxGPUPinLen = 64

// ResumeTokenSize is the length of a session's resume token.
const ResumeTokenSize = 32

// Alloc asks for Size bytes of device memory.
type Alloc struct{ Size uint64 }

// Free releases the allocation that starts at Ptr.
type Free struct{ Ptr uint64 }

// CopyHtoD writes Data to device address Dst. Stream zero is the null
// stream; a non-zero stream may be sent with FlagAsync.
type CopyHtoD struct {
	Dst    uint64
	Stream uint64
	Data   []byte
}

// CopyDtoH reads Size bytes from device address Src.
type CopyDtoH struct {
	Src    uint64
	Size   uint64
	Stream uint64
}

// CopyDtoD copies Size bytes between two device addresses.
type CopyDtoD struct {
	Dst, Src uint64
	Size     uint64
	Stream   uint64
}

// Memset stores Count elements of Width bytes (1, 2 or 4) of Value at Dst.
type Memset struct {
	Dst    uint64
	Width  uint8
	Value  uint32
	Count  uint64
	Stream uint64
}

// ModuleLoad loads a module image (see package kernels for its format).
type ModuleLoad struct{ Image []byte }

// ModuleUnload unloads a module and every function taken from it.
type ModuleUnload struct{ Module uint64 }

// GetFunction looks a kernel up by name in a loaded module.
type GetFunction struct {
	Module uint64
	Name   string
}

// FunctionParams asks for a function's parameter slots (OpFunctionParams).
type FunctionParams struct{ Function uint64 }

// Dim3 is a grid or block shape.
type Dim3 struct{ X, Y, Z uint32 }

// Count is the number of elements X*Y*Z, or MaxUint64 where that does not
// fit in 64 bits (three 32-bit factors can reach 2^96).
func (d Dim3) Count() uint64 {
	hi, lo := bits.Mul64(uint64(d.X)*uint64(d.Y), uint64(d.Z))
	if hi != 0 {
		return math.MaxUint64
	}
	return lo
}

// Launch runs a kernel.
type Launch struct {
	Function    uint64
	Grid, Block Dim3
	SharedBytes uint32
	Stream      uint64
	Args        []Arg
	// Cluster groups the grid's blocks into thread-block clusters of this
	// shape (CUDA's cluster launch; the grid must divide by it); zero for
	// none. Sent after the arguments, only when set.
	Cluster Dim3
	// Cooperative asks for a cooperative launch (cuLaunchCooperativeKernel):
	// every block resident at once, so the grid may synchronise. Sent after
	// the cluster shape (then always written) as a word of launch flags.
	Cooperative bool
}

// LaunchCooperative is the launch-flags bit of Launch.Cooperative.
const LaunchCooperative uint32 = 1

// StreamCreate creates a stream.
type StreamCreate struct{}

// StreamDestroy destroys a stream after its work completes.
type StreamDestroy struct{ Stream uint64 }

// StreamSync waits for a stream and reports its deferred errors.
type StreamSync struct{ Stream uint64 }

// Sync waits for all of the session's work and reports deferred errors.
type Sync struct{}

// ApertureAttach asks the hypervisor to take the guest's memory file FD (a
// memfd sealed against shrinking and growing, of the allocation's size,
// mapped once, shared, by the guest) as the contents of the allocation
// that starts at Ptr. Only over a unix socket: the hypervisor takes the
// file from the guest process (pidfd_getfd) and traces the guest's writes
// to its mapping. Attaching again (after a failover) replaces the old file.
type ApertureAttach struct {
	Ptr  uint64
	Kind ApertureKind
	FD   uint32
}

// ApertureReply says how writes are traced. In ApertureModeUffd the guest
// driver arms userfaultfd write-protection on its mapping before writing
// to it.
type ApertureReply struct{ Mode ApertureMode }

// DeviceInfo asks for the node's device description (OpDeviceInfo).
type DeviceInfo struct{}

// Reject has no body; see OpReject.
type Reject struct{}

// Bye has no body; see OpBye.
type Bye struct{}

// ArgKind is the type of one kernel argument.
type ArgKind uint8

// Argument kinds. Zero is invalid.
const (
	ArgInvalid ArgKind = iota
	ArgPtr             // device pointer, 8 bytes
	ArgU32
	ArgU64
	ArgF32
	ArgF64
	ArgBytes // raw bytes, passed by value
)

// Arg is one typed kernel argument. Scalars and pointers use Bits; ArgBytes
// uses Raw.
type Arg struct {
	Kind ArgKind
	Bits uint64
	Raw  []byte
}

// Size is the number of parameter bytes the argument occupies.
func (a Arg) Size() int {
	switch a.Kind {
	case ArgU32, ArgF32:
		return 4
	case ArgPtr, ArgU64, ArgF64:
		return 8
	case ArgBytes:
		return len(a.Raw)
	}
	return 0
}

// Typed argument constructors.
func Ptr(p uint64) Arg        { return Arg{Kind: ArgPtr, Bits: p} }
func U32(v uint32) Arg        { return Arg{Kind: ArgU32, Bits: uint64(v)} }
func U64(v uint64) Arg        { return Arg{Kind: ArgU64, Bits: v} }
func F32(v float32) Arg       { return Arg{Kind: ArgF32, Bits: uint64(math.Float32bits(v))} }
func F64(v float64) Arg       { return Arg{Kind: ArgF64, Bits: math.Float64bits(v)} }
func Bytes(raw []byte) Arg    { return Arg{Kind: ArgBytes, Raw: raw} }
func (a Arg) F32() float32    { return math.Float32frombits(uint32(a.Bits)) }
func (a Arg) F64() float64    { return math.Float64frombits(a.Bits) }
func (a Arg) U32() uint32     { return uint32(a.Bits) }
func (a Arg) IsPointer() bool { return a.Kind == ArgPtr }

// Reply bodies.

// HelloReply describes the session: its id (for resume) and its device
// virtual-address window.
type HelloReply struct {
	Session    uint64
	WindowBase uint64
	WindowSize uint64
	// Term is the serving node's term; a guest resumes on the node with
	// the highest term it can reach.
	Term uint64
	// Applied is, on resume, the last request of the session the node had
	// answered: applied, or failed (a refused request counts as answered,
	// and a resend of it gets the same failure). The guest resends
	// everything after it that it kept.
	Applied uint64
	// Token is the new session's resume token (version 2; absent on a
	// resume and for a version-1 guest): a secret the guest keeps and
	// presents to resume the session, here or on a promoted standby.
	Token []byte
}

// AllocReply carries the device address of a new allocation.
type AllocReply struct{ Ptr uint64 }

// DataReply carries bytes read from the device.
type DataReply struct {
	Data []byte
	// Release, where set (never on the wire), takes Data back once the
	// reply's bytes are written or copied: whoever sends the reply calls
	// it, and nothing may use Data after. A reply never sent is left to
	// the garbage collector.
	Release func()
}

// HandleReply carries a new guest handle (module, function or stream).
type HandleReply struct{ Handle uint64 }

// FunctionParamsReply lists a function's parameter slots in order (empty
// for a function whose module declared its parameters, a kernel list) and
// the function's attributes as the GPU reports them (CUfunction_attribute
// values by index; empty where the GPU does not say).
type FunctionParamsReply struct {
	Slots []ParamSlot
	Attrs []int32
}

// MaxFunctionAttrs bounds FunctionParamsReply.Attrs.
const MaxFunctionAttrs = 64

// MaxDeviceAttrs bounds DeviceInfoReply.Attrs.
const MaxDeviceAttrs = 1024

// DeviceInfoReply describes a device as CUDA's driver API reports it.
// Attrs[i] is the value of CUdevice_attribute i (cuda.h numbering; index
// zero is unused), for every attribute the node knows.
type DeviceInfoReply struct {
	Name     string
	UUID     [16]byte
	TotalMem uint64
	Attrs    []int32
	// Granularity is the node's allocation granularity, in bytes: what a
	// mapping's address and size must be multiples of (vmm.go). Zero from
	// a node that does not say; it goes after Attrs, and only when
	// non-zero.
	Granularity uint64
	// Limits are a new context's CUlimit values on the node's GPU
	// (cuCtxGetLimit; index = CUlimit), LimitUnsupported where the GPU
	// refuses the limit. Nil from a node that does not say (a software
	// GPU); sent after Granularity, which must then be set.
	Limits []uint64
}

// LimitUnsupported marks a CUlimit the node's GPU does not support.
const LimitUnsupported = ^uint64(0)

// MaxDeviceLimits bounds DeviceInfoReply.Limits.
const MaxDeviceLimits = 64

// Empty is the body of replies that carry only a status.
type Empty struct{}

// Encoders.

func (m *Hello) Append(b []byte) []byte {
	b = binary.LittleEndian.AppendUint32(appendU64(appendString(b, m.GuestName), m.Resume), m.GraceMS)
	if m.GPU == "" {
		return append(b, m.Token...)
	}
	if len(m.Token) == ResumeTokenSize {
		b = append(b, m.Token...)
	} else {
		b = append(b, make([]byte, ResumeTokenSize)...)
	}
	return appendString(b, m.GPU)
}
func (m *Alloc) Append(b []byte) []byte { return appendU64(b, m.Size) }
func (m *Free) Append(b []byte) []byte  { return appendU64(b, m.Ptr) }
func (m *CopyHtoD) Append(b []byte) []byte {
	return appendBytes(appendU64(appendU64(b, m.Dst), m.Stream), m.Data)
}
func (m *CopyDtoH) Append(b []byte) []byte {
	return appendU64(appendU64(appendU64(b, m.Src), m.Size), m.Stream)
}
func (m *CopyDtoD) Append(b []byte) []byte {
	return appendU64(appendU64(appendU64(appendU64(b, m.Dst), m.Src), m.Size), m.Stream)
}
func (m *Memset) Append(b []byte) []byte {
	b = append(appendU64(b, m.Dst), m.Width)
	b = binary.LittleEndian.AppendUint32(b, m.Value)
	return appendU64(appendU64(b, m.Count), m.Stream)
}
func (m *ModuleLoad) Append(b []byte) []byte   { return appendBytes(b, m.Image) }
func (m *ModuleUnload) Append(b []byte) []byte { return appendU64(b, m.Module) }
func (m *GetFunction) Append(b []byte) []byte  { return appendString(appendU64(b, m.Module), m.Name) }
func (m *Launch) Append(b []byte) []byte {
	b = appendU64(b, m.Function)
	b = appendDim3(appendDim3(b, m.Grid), m.Block)
	b = binary.LittleEndian.AppendUint32(b, m.SharedBytes)
	b = appendU64(b, m.Stream)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(m.Args)))
	for _, a := range m.Args {
		b = append(b, byte(a.Kind))
		if a.Kind == ArgBytes {
			b = appendBytes(b, a.Raw)
		} else {
			b = appendU64(b, a.Bits)
		}
	}
	if m.Cluster != (Dim3{}) || m.Cooperative {
		b = appendDim3(b, m.Cluster)
	}
	if m.Cooperative {
		b = binary.LittleEndian.AppendUint32(b, LaunchCooperative)
	}
	return b
}
func (m *StreamCreate) Append(b []byte) []byte  { return b }
func (m *StreamDestroy) Append(b []byte) []byte { return appendU64(b, m.Stream) }
func (m *StreamSync) Append(b []byte) []byte    { return appendU64(b, m.Stream) }
func (m *Sync) Append(b []byte) []byte          { return b }
func (m *Reject) Append(b []byte) []byte        { return b }
func (m *Bye) Append(b []byte) []byte           { return b }
func (m *ApertureAttach) Append(b []byte) []byte {
	return binary.LittleEndian.AppendUint32(append(appendU64(b, m.Ptr), uint8(m.Kind)), m.FD)
}
func (m *ApertureReply) Append(b []byte) []byte { return append(b, uint8(m.Mode)) }
func (m *HelloReply) Append(b []byte) []byte {
	b = appendU64(appendU64(appendU64(appendU64(appendU64(b, m.Session), m.WindowBase), m.WindowSize), m.Term), m.Applied)
	return append(b, m.Token...)
}
func (m *AllocReply) Append(b []byte) []byte     { return appendU64(b, m.Ptr) }
func (m *DataReply) Append(b []byte) []byte      { return appendBytes(b, m.Data) }
func (m *HandleReply) Append(b []byte) []byte    { return appendU64(b, m.Handle) }
func (m *Empty) Append(b []byte) []byte          { return b }
func (m *DeviceInfo) Append(b []byte) []byte     { return b }
func (m *FunctionParams) Append(b []byte) []byte { return appendU64(b, m.Function) }
func (m *FunctionParamsReply) Append(b []byte) []byte {
	b = binary.LittleEndian.AppendUint16(b, uint16(len(m.Slots)))
	for _, p := range m.Slots {
		b = binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(b, p.Offset), p.Size)
	}
	b = binary.LittleEndian.AppendUint16(b, uint16(len(m.Attrs)))
	for _, v := range m.Attrs {
		b = binary.LittleEndian.AppendUint32(b, uint32(v))
	}
	return b
}
func (m *DeviceInfoReply) Append(b []byte) []byte {
	b = appendU64(append(appendString(b, m.Name), m.UUID[:]...), m.TotalMem)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(m.Attrs)))
	for _, v := range m.Attrs {
		b = binary.LittleEndian.AppendUint32(b, uint32(v))
	}
	if m.Granularity != 0 {
		b = appendU64(b, m.Granularity)
		if len(m.Limits) > 0 {
			b = append(b, byte(len(m.Limits)))
			for _, v := range m.Limits {
				b = appendU64(b, v)
			}
		}
	}
	return b
}

// Decoders.

func (m *Hello) decode(d *Decoder) {
	m.GuestName = d.String(MaxNameLen)
	m.Resume = d.U64()
	m.GraceMS = d.U32()
	m.Token = d.token()
	if d.err != nil || m.Token == nil || len(d.b) == 0 {
		return // no pin without the token field it follows
	}
	m.GPU = d.gpuPin()
	if bytes.Equal(m.Token, make([]byte, ResumeTokenSize)) {
		m.Token = nil // the field a pin follows, holding no token
	}
}
func (m *Alloc) decode(d *Decoder) { m.Size = d.U64() }
func (m *Free) decode(d *Decoder)  { m.Ptr = d.U64() }
func (m *CopyHtoD) decode(d *Decoder) {
	m.Dst = d.U64()
	m.Stream = d.U64()
	m.Data = d.Bytes(math.MaxUint32)
}
func (m *CopyDtoH) decode(d *Decoder) { m.Src = d.U64(); m.Size = d.U64(); m.Stream = d.U64() }
func (m *CopyDtoD) decode(d *Decoder) {
	m.Dst = d.U64()
	m.Src = d.U64()
	m.Size = d.U64()
	m.Stream = d.U64()
}
func (m *Memset) decode(d *Decoder) {
	m.Dst = d.U64()
	m.Width = d.U8()
	m.Value = d.U32()
	m.Count = d.U64()
	m.Stream = d.U64()
}
func (m *ModuleLoad) decode(d *Decoder)   { m.Image = d.Bytes(MaxModuleImage) }
func (m *ModuleUnload) decode(d *Decoder) { m.Module = d.U64() }
func (m *GetFunction) decode(d *Decoder)  { m.Module = d.U64(); m.Name = d.String(MaxKernelName) }
func (m *Launch) decode(d *Decoder) {
	m.Function = d.U64()
	m.Grid = d.dim3()
	m.Block = d.dim3()
	m.SharedBytes = d.U32()
	m.Stream = d.U64()
	n := int(d.U16())
	if n > MaxArgs {
		d.fail(fmt.Errorf("%w: %d kernel arguments, limit %d", ErrBadArgument, n, MaxArgs))
		return
	}
	m.Args = make([]Arg, 0, n)
	total := 0
	for i := 0; i < n && d.err == nil; i++ {
		a := Arg{Kind: ArgKind(d.U8())}
		switch a.Kind {
		case ArgPtr, ArgU32, ArgU64, ArgF32, ArgF64:
			a.Bits = d.U64()
		case ArgBytes:
			a.Raw = d.Bytes(MaxParamBytes)
		default:
			d.fail(fmt.Errorf("%w: argument %d has kind %d", ErrBadArgument, i, a.Kind))
			return
		}
		total += a.Size()
		m.Args = append(m.Args, a)
	}
	if total > MaxParamBytes {
		d.fail(fmt.Errorf("%w: %d parameter bytes, limit %d", ErrBadArgument, total, MaxParamBytes))
	}
	if d.err == nil && len(d.b) >= 12 { // a cluster shape; anything shorter is trailing bytes
		m.Cluster = d.dim3()
		m.decodeFlags(d)
	}
}

// decodeFlags reads the launch-flags word that may follow a cluster shape
// (never one without it: one encoding per launch).
func (m *Launch) decodeFlags(d *Decoder) {
	if len(d.b) < 4 { // no flags; anything shorter is trailing bytes
		if m.Cluster == (Dim3{}) {
			d.fail(fmt.Errorf("%w: a zero cluster shape is sent as none", ErrBadArgument))
		}
		return
	}
	flags := d.U32()
	if flags&^LaunchCooperative != 0 || flags == 0 { // no flags are sent as none
		d.fail(fmt.Errorf("%w: launch flags %#x", ErrBadArgument, flags))
		return
	}
	m.Cooperative = flags&LaunchCooperative != 0
}
func (m *StreamCreate) decode(d *Decoder)   {}
func (m *StreamDestroy) decode(d *Decoder)  { m.Stream = d.U64() }
func (m *StreamSync) decode(d *Decoder)     { m.Stream = d.U64() }
func (m *Sync) decode(d *Decoder)           {}
func (m *Reject) decode(d *Decoder)         {}
func (m *DeviceInfo) decode(d *Decoder)     {}
func (m *FunctionParams) decode(d *Decoder) { m.Function = d.U64() }
func (m *FunctionParamsReply) decode(d *Decoder) {
	n := int(d.U16())
	if n > MaxArgs {
		d.fail(fmt.Errorf("%w: %d parameter slots, limit %d", ErrBadArgument, n, MaxArgs))
		return
	}
	for i := 0; i < n && d.err == nil; i++ {
		m.Slots = append(m.Slots, ParamSlot{Offset: d.U32(), Size: d.U32()})
	}
	if err := CheckSlots(m.Slots); err != nil {
		d.fail(err)
		return
	}
	n = int(d.U16())
	if n > MaxFunctionAttrs {
		d.fail(fmt.Errorf("%w: %d function attributes, limit %d", ErrBadArgument, n, MaxFunctionAttrs))
		return
	}
	for i := 0; i < n && d.err == nil; i++ {
		m.Attrs = append(m.Attrs, int32(d.U32()))
	}
}
func (m *DeviceInfoReply) decode(d *Decoder) {
	m.Name = d.String(MaxNameLen)
	copy(m.UUID[:], d.take(len(m.UUID)))
	m.TotalMem = d.U64()
	n := int(d.U16())
	if n > MaxDeviceAttrs {
		d.fail(fmt.Errorf("%w: %d device attributes, limit %d", ErrBadArgument, n, MaxDeviceAttrs))
		return
	}
	m.Attrs = make([]int32, 0, min(n, len(d.b)/4))
	for i := 0; i < n && d.err == nil; i++ {
		m.Attrs = append(m.Attrs, int32(d.U32()))
	}
	if d.err == nil && len(d.b) >= 8 { // a granularity; anything shorter is trailing bytes
		if m.Granularity = d.U64(); m.Granularity == 0 {
			d.fail(fmt.Errorf("%w: a granularity of zero is sent as none", ErrBadArgument))
		}
	}
	if d.err == nil && m.Granularity != 0 && len(d.b) > 0 {
		n := int(d.U8())
		if n == 0 || n > MaxDeviceLimits {
			d.fail(fmt.Errorf("%w: %d context limits, want 1 to %d", ErrBadArgument, n, MaxDeviceLimits))
			return
		}
		m.Limits = make([]uint64, 0, min(n, len(d.b)/8))
		for i := 0; i < n && d.err == nil; i++ {
			m.Limits = append(m.Limits, d.U64())
		}
	}
}
func (m *Bye) decode(d *Decoder) {}
func (m *ApertureAttach) decode(d *Decoder) {
	m.Ptr = d.U64()
	m.Kind = ApertureKind(d.U8())
	m.FD = d.U32()
}
func (m *ApertureReply) decode(d *Decoder) { m.Mode = ApertureMode(d.U8()) }
func (m *HelloReply) decode(d *Decoder) {
	m.Session = d.U64()
	m.WindowBase = d.U64()
	m.WindowSize = d.U64()
	m.Term = d.U64()
	m.Applied = d.U64()
	m.Token = d.token()
}
func (m *AllocReply) decode(d *Decoder)  { m.Ptr = d.U64() }
func (m *DataReply) decode(d *Decoder)   { m.Data = d.Bytes(math.MaxUint32) }
func (m *HandleReply) decode(d *Decoder) { m.Handle = d.U64() }
func (m *Empty) decode(d *Decoder)       {}

// AppendReply encodes a reply payload: status, message, then body (nil for
// none). Bodies are only sent with StatusOK.
func AppendReply(b []byte, st Status, msg string, body Body) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(st))
	if len(msg) > 1024 {
		msg = msg[:1024]
	}
	b = appendString(b, msg)
	if body != nil && st.CarriesBody() {
		b = body.Append(b)
	}
	return b
}

// DecodeReply splits a reply payload. On a status that carries one
// (Status.CarriesBody) it decodes the body into body (which may be nil for
// an empty body).
func DecodeReply(payload []byte, body Body) (Status, string, error) {
	d := Decoder{b: payload}
	st := Status(d.U32())
	msg := d.String(1024)
	if d.err == nil && st.CarriesBody() && len(d.b) > 0 && body != nil {
		return st, msg, Unmarshal(d.b, body) // a decoder of its own: this one stays off the heap
	}
	return st, msg, d.Finish()
}

// Decoder reads little-endian fields, recording the first error; every read
// after an error returns zero values.
type Decoder struct {
	b   []byte
	err error
}

// NewDecoder returns a decoder over b.
func NewDecoder(b []byte) *Decoder { return &Decoder{b: b} }

func (d *Decoder) fail(err error) {
	if d.err == nil {
		d.err = err
	}
	d.b = nil
}

func (d *Decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b) {
		d.fail(ErrTruncated)
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

// U8 reads a byte.
func (d *Decoder) U8() uint8 {
	if v := d.take(1); v != nil {
		return v[0]
	}
	return 0
}

// U16 reads a 16-bit integer.
func (d *Decoder) U16() uint16 {
	if v := d.take(2); v != nil {
		return binary.LittleEndian.Uint16(v)
	}
	return 0
}

// U32 reads a 32-bit integer.
func (d *Decoder) U32() uint32 {
	if v := d.take(4); v != nil {
		return binary.LittleEndian.Uint32(v)
	}
	return 0
}

// U64 reads a 64-bit integer.
func (d *Decoder) U64() uint64 {
	if v := d.take(8); v != nil {
		return binary.LittleEndian.Uint64(v)
	}
	return 0
}

// Bytes reads a u32-length-prefixed byte string of at most max bytes. The
// result aliases the input.
func (d *Decoder) Bytes(max int) []byte {
	n := d.U32()
	if d.err == nil && int64(n) > int64(max) {
		d.fail(fmt.Errorf("%w: %d-byte field, limit %d", ErrBadArgument, n, max))
		return nil
	}
	return d.take(int(n))
}

// String reads a u16-length-prefixed string of at most max bytes.
func (d *Decoder) String(max int) string {
	n := int(d.U16())
	if d.err == nil && n > max {
		d.fail(fmt.Errorf("%w: %d-byte string, limit %d", ErrBadArgument, n, max))
		return ""
	}
	return string(d.take(n))
}

func (d *Decoder) dim3() Dim3 { return Dim3{X: d.U32(), Y: d.U32(), Z: d.U32()} }

// token reads an optional trailing resume token: nothing (a version-1 peer,
// or none to send), or exactly ResumeTokenSize bytes. Anything else is left
// for Finish to refuse as trailing bytes.
func (d *Decoder) token() []byte {
	if d.err != nil || len(d.b) < ResumeTokenSize {
		return nil
	}
	return d.take(ResumeTokenSize)
}

// Finish returns the first error, or ErrTrailing if input is left over.
func (d *Decoder) Finish() error {
	if d.err != nil {
		return d.err
	}
	if len(d.b) != 0 {
		return fmt.Errorf("%w (%d bytes)", ErrTrailing, len(d.b))
	}
	return nil
}

func appendU64(b []byte, v uint64) []byte { return binary.LittleEndian.AppendUint64(b, v) }
func appendBytes(b, v []byte) []byte {
	return append(binary.LittleEndian.AppendUint32(b, uint32(len(v))), v...)
}
func appendString(b []byte, s string) []byte {
	return append(binary.LittleEndian.AppendUint16(b, uint16(len(s))), s...)
}
func appendDim3(b []byte, d Dim3) []byte {
	b = binary.LittleEndian.AppendUint32(b, d.X)
	b = binary.LittleEndian.AppendUint32(b, d.Y)
	return binary.LittleEndian.AppendUint32(b, d.Z)
}
