// Package gpu defines Backend, the seam between the hypervisor (and the
// standby, which replays onto the same interface) and a real or simulated
// GPU. It owns no state of its own.
//
// A Backend hands out Contexts, one per guest session: a context owns its
// device allocations, modules and streams, and one context can never reach
// another's memory. Callers validate guest input before calling; a backend
// still refuses anything outside its context (defence in depth) and never
// panics on bad arguments.
//
// Addresses are chosen by the caller, not the backend: the hypervisor's
// allocator decides where each allocation lives inside the context's window
// so that a standby can reproduce the same device addresses (pointers hide
// in kernel arguments and device memory, where no table could translate
// them). A backend that cannot place the window where asked reports the
// base it got, and the caller falls back to address translation.
//
// A node that serves several GPUs hands the hypervisor a Set (set.go):
// one Backend per GPU, each named by its index on the host; the
// hypervisor places every session on one of them (DevicesOf) and sends
// host-wide work (page-locked host memory) through the first (Host).
package gpu

import (
	"encoding/binary"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Backend is a local GPU.
type Backend interface {
	// Name is the backend's kind, e.g. "sim" or "cuda".
	Name() string
	// NewContext creates an isolated context whose allocations live in a
	// device virtual-address window of size bytes, asked for at base. The
	// context's Window reports where it really lies.
	NewContext(base, size uint64) (Context, error)
	// Close releases the device.
	Close() error
}

// Handles a backend hands out. They mean nothing outside their context and
// are never shown to a guest (guests see handlemap's virtual handles).
type (
	Module   uint64
	Function uint64
	Stream   uint64 // zero is the context's null stream
)

// LaunchConfig is a kernel launch's shape.
type LaunchConfig struct {
	Grid, Block abi.Dim3
	SharedBytes uint32
	// Cluster is the thread-block cluster shape (zero: none); the grid
	// divides by it.
	Cluster abi.Dim3
	// Cooperative launches every block at once (cuLaunchCooperativeKernel);
	// a grid larger than the GPU holds is refused, not run.
	Cooperative bool
}

// Context is one guest's slice of the GPU. Methods are called from one
// goroutine at a time.
type Context interface {
	// Window is the base the context's address window really got.
	Window() (base, size uint64)
	// Alloc backs [addr, addr+size) inside the window with device memory.
	Alloc(addr, size uint64) error
	// Free releases the allocation that starts at addr.
	Free(addr uint64) error
	CopyHtoD(dst uint64, src []byte, s Stream) error
	CopyDtoH(dst []byte, src uint64, s Stream) error
	CopyDtoD(dst, src, size uint64, s Stream) error
	// Memset stores count elements of width bytes (1, 2 or 4).
	Memset(dst uint64, width int, value uint32, count uint64, s Stream) error
	LoadModule(img *abi.ModuleImage) (Module, error)
	UnloadModule(m Module) error
	Function(m Module, name string) (Function, error)
	// Launch runs f; args have been checked against the kernel's signature.
	Launch(f Function, cfg LaunchConfig, args []abi.Arg, s Stream) error
	CreateStream() (Stream, error)
	DestroyStream(s Stream) error
	SyncStream(s Stream) error
	Sync() error
	// Close frees everything the context holds.
	Close() error
}

// Limits every backend enforces on launches, matching CUDA's for compute
// capability 7.0 and later (CUDA Programming Guide, "Compute Capabilities").
const (
	MaxThreadsPerBlock = 1024
	MaxSharedBytes     = 48 << 10
	MaxGridX           = 1<<31 - 1
	MaxGridYZ          = 65535
	MaxBlockZ          = 64
	// MaxClusterBlocks bounds a thread-block cluster (16 with the
	// non-portable size a Hopper GPU allows; the GPU refuses what it
	// cannot run).
	MaxClusterBlocks = 16
)

// SharedMemoryLimiter is implemented by backends whose kernels may opt in
// to more dynamic shared memory per block than MaxSharedBytes.
type SharedMemoryLimiter interface {
	MaxSharedBytesOptIn() uint32
}

// HostAllocator is implemented by backends that copy faster from host
// memory they allocate themselves (page-locked memory on CUDA). The standby
// receives replicated data straight into such buffers. Buffers live as long
// as the backend.
type HostAllocator interface {
	AllocHost(n int) ([]byte, error)
}

// AccessChecker is implemented by backends that check every memory access
// a kernel makes against the launching context's allocations (the software
// GPU does; a real GPU runs the kernel's code unchecked). Only on such a
// backend may kernels that follow pointers stored in device memory run
// beside other guests in one process.
type AccessChecker interface {
	ChecksEveryAccess() bool
}

// FunctionDescriber is implemented by contexts that load raw (cubin,
// fatbin) images: they say where each of a function's parameters lives in
// its parameter buffer, as the loaded code expects it, and give the
// function's attributes (CUfunction_attribute values, by index).
type FunctionDescriber interface {
	ParamSlots(f Function) ([]abi.ParamSlot, error)
	FunctionAttrs(f Function) ([]int32, error)
}

// HealthReporter is implemented by backends that can break for good (a
// CUDA process whose state a faulting kernel corrupted): Healthy is nil
// while new guests can be served.
type HealthReporter interface {
	Healthy() error
}

// SpareReporter is implemented by backends that make contexts ahead
// (CUDA's spare contexts, GPU workers that have opened the GPU): how many
// are ready for new sessions, of how many it keeps.
type SpareReporter interface {
	Spares() (ready, kept int)
}

// LaunchPipeliner is implemented by contexts that can hand their launches
// to a thread of their own, so the caller goes on to its next request
// while the driver submits this one. A launch the driver then refuses is
// reported by the context's next Sync or SyncStream, as a GPU reports an
// asynchronous launch's failure. The hypervisor turns it on for sessions
// a guest drives and for a replica's.
type LaunchPipeliner interface {
	PipelineLaunches()
}

// LaunchBatcher is implemented by contexts that can hold pipelined
// launches back and hand them on together (a GPU worker's: one write and
// one wake-up of the worker for many launches, not one each). Once
// BatchLaunches was called, the caller must call Flush whenever it has
// no more calls for the context for now; until then held launches wait
// for the next call that is not a launch, or for enough of them.
type LaunchBatcher interface {
	BatchLaunches()
	// Flush hands on the launches held; an error is the context's loss.
	Flush() error
}

// QueuedCopier is implemented by contexts that can leave a host-to-device
// copy queued on the device, its source read after the call returned
// (cuMemcpyHtoDAsync from page-locked memory). A standby replaying a log
// uses it for records that arrived in such memory: it keeps each record's
// bytes unchanged until the copies that read them are settled, so it
// queues runs of records on the device instead of waiting for every copy,
// and waits for one run while the device works through the next.
type QueuedCopier interface {
	// QueueCopyHtoD is CopyHtoD that may return before src was read; the
	// copy keeps its place in s's order (0: the null stream) as
	// CopyHtoD's would.
	QueueCopyHtoD(dst uint64, src []byte, s Stream) error
	// Mark notes how far the context's queued work has come, as mark
	// (each mark larger than the last).
	Mark(mark uint64) error
	// Settle returns once no copy queued before Mark(upTo), or any
	// earlier mark, reads host memory. An error is a queued copy's
	// failure (or the device's).
	Settle(upTo uint64) error
}

// DeviceDescriber is implemented by backends that can describe their
// device as CUDA's driver API does (name, memory, every CUdevice_attribute):
// what a guest's libcuda reports to the program. The description must not
// change while the backend lives.
type DeviceDescriber interface {
	DeviceInfo() (abi.DeviceInfoReply, error)
}

// DeviceStatusReporter is implemented by backends that can read their
// device's live state (temperature, power, clocks, utilization, ...) as
// NVIDIA's management library reports it: what a guest's NVML shows. It
// sets the fields it truly has in r and leaves the rest out (the guest
// answers those as not supported); the memory fields are the
// hypervisor's, which knows what each guest holds. It must not block on
// the device's work queue.
type DeviceStatusReporter interface {
	DeviceStatus(r *abi.DeviceStatusReply)
}

// DeviceAttrCount is one past the highest CUdevice_attribute this project
// knows (CU_DEVICE_ATTRIBUTE_MAX in CUDA 13's cuda.h).
const DeviceAttrCount = 148

// HostRegistrar is implemented by backends that can page-lock host memory
// they did not allocate (cuMemHostRegister on CUDA), so device copies from
// it run at DMA rate. The hypervisor registers a shared-memory guest's
// area with it for the connection's life. The memory's bytes may change
// at any moment (a guest writes them): the backend must only ever copy
// from it, never trust it. unregister must be called before the memory
// is unmapped.
type HostRegistrar interface {
	RegisterHost(mem []byte) (unregister func() error, err error)
}

// OccupancyCalculator is implemented by contexts whose GPU driver answers
// occupancy questions about their functions (abi.Occupancy: blocks per
// multiprocessor, active clusters, the largest cluster), with the
// function's attributes set as q says. q's block is non-empty and within
// MaxThreadsPerBlock; everything else is the guest's, for the driver to
// judge.
type OccupancyCalculator interface {
	Occupancy(f Function, q *abi.Occupancy) (int32, error)
}

// TensorMapEncoder is implemented by contexts whose GPU driver encodes
// tensor maps (cuTensorMapEncodeTiled). r.Global is a device address the
// caller checked, with the whole tensor, against the session's memory.
type TensorMapEncoder interface {
	EncodeTensorMapTiled(r *abi.TensorMapEncode) ([abi.TensorMapBytes]byte, error)
}

// Checksummer is implemented by backends that checksum device memory on the
// device, so verify need not copy whole objects to the host. The result
// must equal Checksum of the same bytes.
type Checksummer interface {
	Checksum(addr, n uint64) (uint64, error)
}

// Checksum is the content checksum verify compares: the sum over the
// little-endian 64-bit words w_i of the data (the last one zero-padded) of
// w_i*(2i+1), modulo 2^64, mixed with the length. Any single changed word
// changes it (2i+1 is odd, so invertible modulo 2^64), and, unlike a CRC,
// it can be summed in any order, so a GPU computes it with one atomic add
// per thread.
func Checksum(b []byte) uint64 {
	var sum uint64
	i := uint64(0)
	for ; len(b) >= 8; b, i = b[8:], i+1 {
		sum += binary.LittleEndian.Uint64(b) * (2*i + 1)
	}
	return FinishChecksum(sum, i, b)
}

// FinishChecksum adds the trailing bytes (fewer than 8) after nwords full
// words, and the length.
func FinishChecksum(sum, nwords uint64, tail []byte) uint64 {
	if len(tail) > 0 {
		var w [8]byte
		copy(w[:], tail)
		sum += binary.LittleEndian.Uint64(w[:]) * (2*nwords + 1)
	}
	n := nwords*8 + uint64(len(tail))
	return sum ^ (n * 0x9e3779b97f4a7c15)
}

// Snapshotter is implemented by contexts that can take a point-in-time copy
// of device memory far faster than it can be read out, so that a resync
// stops guests only while the copy is taken, not while it is sent.
type Snapshotter interface {
	// SnapshotMemory captures the contents of ranges (each inside one
	// allocation) as they are now. It is called like the context's other
	// methods (never concurrently with them), must not wait for anything
	// but the device, and must cost little more than O(len(ranges)) or a
	// device-to-device copy. Taking a snapshot releases the context's
	// previous one. A backend that cannot take one now (no memory for it)
	// returns an error; the caller then copies the old way.
	SnapshotMemory(ranges []Range) (MemorySnapshot, error)
}

// Prefaulter is implemented by contexts whose fresh memory is slow to
// write the first time (the software GPU's memory is host pages that the
// kernel zeroes and maps on first touch). A standby being resynced, which
// writes every byte of the allocations it recreates, asks for them to be
// made ready in the background, ahead of the contents it applies.
type Prefaulter interface {
	// Prefault starts making [addr, addr+size) of an allocation ready to
	// write; it returns at once and never changes the contents.
	Prefault(addr, size uint64)
}

// Range is a span of device addresses.
type Range struct{ Addr, Size uint64 }

// MemorySnapshot is device memory as it was when the snapshot was taken.
// Its methods may be called from any goroutine, concurrently with the
// context's methods (guests keep running while it is read), but not with
// each other.
type MemorySnapshot interface {
	// ReadAt copies len(p) bytes at device address addr, as they were when
	// the snapshot was taken, into p; the span must lie inside one of the
	// captured ranges. Each byte is meant to be read once: once a whole
	// page has been read the snapshot may let go of it, and a later read
	// of it may see newer contents.
	ReadAt(p []byte, addr uint64) error
	// Release frees what the snapshot holds. It fails later reads.
	Release()
}

// GlobalAccessor is implemented by contexts whose modules' variables
// (__device__ and __constant__ globals) can be found and copied by name
// (cuModuleGetGlobal). A variable lives where the backend loaded its
// module, outside the session's window; its address is the backend's own.
type GlobalAccessor interface {
	// Global is where variable name of m lies and its size.
	Global(m Module, name string) (addr, size uint64, err error)
	// WriteGlobal and ReadGlobal copy into and out of [addr, addr+len)
	// of a variable Global found, after the context's earlier work.
	WriteGlobal(addr uint64, src []byte) error
	ReadGlobal(dst []byte, addr uint64) error
}

// ProcessIsolator is implemented by backends that run every context in a
// process of its own (hypervisor/gpu/worker): a kernel of one context,
// the guest's own included, cannot reach another context's memory, and a
// fault ends its own context only. Such a backend may serve guests' own
// kernels beside other guests.
type ProcessIsolator interface {
	IsolatesContexts() bool
}

// IsolatesContexts reports whether b runs every context in a process of
// its own (ProcessIsolator).
func IsolatesContexts(b Backend) bool {
	p, ok := b.(ProcessIsolator)
	return ok && p.IsolatesContexts()
}
