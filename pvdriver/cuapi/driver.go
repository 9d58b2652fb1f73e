// Package cuapi is the CUDA driver API over pvdriver: the Go half of the
// guest's libcuda.so.1 (pvdriver/libcuda holds the C half, which exports
// NVIDIA's symbol names and converts C arguments). It keeps what CUDA
// keeps in the driver — contexts, the handles a program holds, event
// times, a snapshot of the device — and sends everything that touches the
// GPU through one pvdriver session, so session resume and exactly-once
// after a failover are pvdriver's, as for Go guests.
//
// Handles (CUcontext, CUmodule, CUfunction, CUstream, CUevent) are opaque
// values this package mints from one counter, so a handle of one kind is
// never mistaken for another's; CUdeviceptr values are the session
// window's real device addresses. The device's description is taken once,
// at cuInit, and kept: a failover changes nothing the program can see.
//
// Semantics follow the CUDA Driver API reference (CUDA 13); where this
// driver does something simpler it is said at the function.
package cuapi

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Version is what cuDriverGetVersion reports: the CUDA version whose
// entry points this driver serves (cuCtxCreate_v4 and the CUDA 13
// attribute table included).
const Version = 13000

// Thread is the calling thread's stack of current contexts (CUDA keeps one
// per OS thread). The C half keeps it in thread-local storage.
type Thread interface {
	Top() uint64
	SetTop(ctx uint64)
	Push(ctx uint64) bool
	Pop() uint64
}

// Driver is a process's CUDA driver.
type Driver struct {
	mu     sync.Mutex
	client *pvdriver.Client
	dev    abi.DeviceInfoReply
	// visible are the served devices the process may use, by ordinal
	// (VisibleDevices); empty when CUDA_VISIBLE_DEVICES names none.
	visible []int
	base    uint64 // the session's device window, for telling device from host addresses
	size    uint64
	next    uint64 // last minted handle

	primary *ctxState // the device's primary context
	ctxs    map[uint64]*ctxState
	allocs  map[uint64]allocation
	modules map[uint64]*module
	// shared are the node modules handles of one image share, loaded or
	// parked (modcache.go); parkOrder lists the parked, oldest first.
	shared    map[imageKey]*sharedModule
	parkOrder []imageKey
	funcs     map[uint64]*function
	streams   map[uint64]*stream
	events    map[uint64]*event
	// Graphs and stream captures (graph.go): captures by every stream in
	// one, the captures events recorded in them belong to, graphs being
	// built or built, instantiated graphs.
	captures       map[uint64]*capture
	capturedEvents map[uint64]*capture
	graphs         map[uint64]*graph
	execs          map[uint64]*graph
	used           uint64                // bytes allocated
	hosts          map[uintptr]hostAlloc // host memory from cuMemAllocHost and cuMemHostAlloc, or registered (hostmem.go)
	hostLo, hostHi uint64                // a span holding every host memory ever recorded (a quick test before a search of hosts)
	hostBases      []uintptr             // the keys of hosts, in order (hostAt's binary search: a launch looks up its arguments)

	globals      map[uint64]moduleGlobal // module variables by their address on the node (globals.go)
	primaryFlags uint32                  // cuDevicePrimaryCtxSetFlags
	closed       bool                    // the session ended with the process (Shutdown): every call is CUDA_ERROR_DEINITIALIZED
	initialized  bool                    // cuInit succeeded (the session may be open without it: Session)

	apertures map[uint64]*pvdriver.Aperture // by device address (aperture.go)
	// memHandles are cuMemCreate's handles, mappings cuMemMap's ranges by
	// address (vmm.go).
	memHandles map[uint64]*memHandle
	mappings   map[uint64]*vmMapping
	// noBinary holds the images the node's GPU has no code for: a
	// framework offers the same ones again and again, and NVIDIA's driver
	// refuses them from their headers, at no cost (module.go).
	noBinary map[abi.ImageHash]bool
	// mapped are the host buffers a device address was asked for
	// (mapped.go).
	mapped mirrors
	// onChange is called whenever an answer kept outside the driver may
	// have changed (OnChange).
	onChange func()
	idle     idleMarks // streams a completed wait left idle (idle.go)
}

type ctxState struct {
	handle uint64
	flags  uint32
	refs   int              // primary context: retains; others: 1 until destroyed
	limits map[int32]uint64 // cuCtxSetLimit's values (runtime.go)
}

// hostAlloc is host memory the program got from this driver, or
// registered with it (hostmem.go).
type hostAlloc struct {
	size       uint64
	region     []byte // the session region's buffer; nil for ordinary memory
	ctx        uint64 // the context current when it was allocated or registered
	registered bool   // cuMemHostRegister's: the program's own memory
	readOnly   bool   // registered with CU_MEMHOSTREGISTER_READ_ONLY
}

type allocation struct {
	size uint64
	ctx  uint64
}

// New returns a driver that is not initialised yet (cuInit).
func New() *Driver { return &Driver{} }

// OnChange registers fn, called with the driver's lock held whenever an
// answer of the queries a caller may keep (the current context's device,
// a context being live, the primary context's state, a function's
// attributes and name) may have changed: a context destroyed, the primary
// context made or its flags set, a function's attribute set or the
// function unloaded, the driver shut down. Handles are never reused, so a
// kept answer stays true until then. libcuda keeps them in C
// (answers.c), where a query costs no call into Go.
func (d *Driver) OnChange(fn func()) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.onChange = fn
}

// changed calls the OnChange function.
// Precondition: d.mu must be locked.
func (d *Driver) changed() {
	if d.onChange != nil {
		d.onChange()
	}
}

// Init is cuInit: it opens the process's session (open) unless its NVML
// already did, and fails with CUDA_ERROR_NO_DEVICE when
// CUDA_VISIBLE_DEVICES leaves no device.
func (d *Driver) Init(flags uint32) Result {
	if flags != 0 {
		return ErrorInvalidValue
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.open("cuInit"); r != Success {
		return r
	}
	if len(d.visible) == 0 {
		return ErrorNoDevice
	}
	d.initialized = true
	return Success
}

// Session is the process's session with the node, its device's
// description (taken once, at the first open) and the devices visible to
// the process (VisibleDevices), opening the session first if neither
// cuInit nor an earlier call did: the guest's NVML (pvdriver/nvmlapi)
// shares it, so a process's CUDA and NVML see one session and one view
// of the devices. caller names the entry point in messages.
func (d *Driver) Session(caller string) (*pvdriver.Client, abi.DeviceInfoReply, []int, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.open(caller); r != Success {
		return nil, abi.DeviceInfoReply{}, nil, r
	}
	return d.client, d.dev, d.visible, Success
}

// openWait bounds the search for a node that opens the session: a new
// session's hello may take up to 30 s (a GPU context made while many
// guests start; pvdriver's helloWait), a takeover found meanwhile a few
// more. A node that refuses, or an endpoint nobody listens on without
// failover endpoints, fails at once.
const openWait = 45 * time.Second

// open opens the session with the primary named by VGPUHA_ENDPOINT
// (failover endpoints in VGPUHA_FAILOVER, comma-separated), takes the
// device's description and which devices CUDA_VISIBLE_DEVICES leaves.
// Without an endpoint, or when no node answers, the machine has no
// device.
// Precondition: d.mu must be locked.
func (d *Driver) open(caller string) Result {
	if d.closed {
		return ErrorDeinitialized
	}
	if d.client != nil {
		return Success
	}
	ep, opts, ok := endpoint(caller)
	if !ok {
		return ErrorNoDevice
	}
	ctx, cancel := context.WithTimeout(context.Background(), openWait)
	defer cancel()
	c, err := pvdriver.Open(ctx, ep, opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "vgpuha libcuda: %s: %v\n", caller, err)
		return ErrorNoDevice
	}
	dev, err := c.DeviceInfo()
	if err != nil {
		c.Close()
		fmt.Fprintf(os.Stderr, "vgpuha libcuda: %s: describing the device: %v\n", caller, err)
		return ErrorNoDevice
	}
	d.client, d.dev, d.visible = c, dev, visibleOf(dev)
	d.base, d.size = c.Window()
	d.ctxs, d.allocs, d.modules = map[uint64]*ctxState{}, map[uint64]allocation{}, map[uint64]*module{}
	d.funcs, d.streams, d.events = map[uint64]*function{}, map[uint64]*stream{}, map[uint64]*event{}
	d.captures, d.capturedEvents = map[uint64]*capture{}, map[uint64]*capture{}
	d.graphs, d.execs = map[uint64]*graph{}, map[uint64]*graph{}
	return Success
}

// endpoint is where the process's node is: VGPUHA_ENDPOINT, and the
// failover endpoints in VGPUHA_FAILOVER (comma-separated), with the
// process named as the guest; false (said on stderr, naming caller)
// without an endpoint.
func endpoint(caller string) (string, pvdriver.Options, bool) {
	ep := os.Getenv("VGPUHA_ENDPOINT")
	if ep == "" {
		fmt.Fprintf(os.Stderr, "vgpuha libcuda: %s: VGPUHA_ENDPOINT is not set (unix:///path or tcp://host:port of a vgpuha primary)\n", caller)
		return "", pvdriver.Options{}, false
	}
	opts := pvdriver.Options{GuestName: "libcuda:" + progName(), GPU: strings.TrimSpace(os.Getenv("VGPUHA_GPU"))}
	for _, f := range strings.Split(os.Getenv("VGPUHA_FAILOVER"), ",") {
		if f = strings.TrimSpace(f); f != "" {
			opts.Failover = append(opts.Failover, f)
		}
	}
	return ep, opts, true
}

// visibleOf is which of the node's devices (it serves one, dev)
// CUDA_VISIBLE_DEVICES leaves the process.
func visibleOf(dev abi.DeviceInfoReply) []int {
	spec, set := os.LookupEnv("CUDA_VISIBLE_DEVICES")
	return VisibleDevices(spec, set, [][16]byte{dev.UUID})
}

// ErrNoEndpoint is Watch's error without VGPUHA_ENDPOINT (already said
// on stderr).
var ErrNoEndpoint = errors.New("VGPUHA_ENDPOINT is not set")

// OpenSession is the process's session if one is open now (nil if not):
// unlike Session it never opens one.
func (d *Driver) OpenSession() *pvdriver.Client {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	return d.client
}

// Watch opens a status connection (pvdriver.StatusClient) to the node
// the process's session would go to, with the same endpoint settings,
// and takes the device's description and the devices visible to the
// process from it as a session does: what the guest's NVML asks while
// the process has no session (nvidia-smi), so that watching the device
// takes no session slot. It opens no session; err is the node's or the
// transport's (an older node refuses with abi.StatusBadFrame).
func (d *Driver) Watch(caller string) (*pvdriver.StatusClient, abi.DeviceInfoReply, []int, error) {
	ep, opts, ok := endpoint(caller)
	if !ok {
		return nil, abi.DeviceInfoReply{}, nil, ErrNoEndpoint
	}
	opts.GuestName = "libnvidia-ml:" + progName()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pvdriver.OpenStatus(ctx, ep, opts)
	if err != nil {
		return nil, abi.DeviceInfoReply{}, nil, err
	}
	dev, err := c.DeviceInfo()
	if err != nil {
		c.Close()
		return nil, abi.DeviceInfoReply{}, nil, fmt.Errorf("describing the device: %w", err)
	}
	return c, dev, visibleOf(dev), nil
}

func progName() string {
	if len(os.Args) > 0 {
		return filepath.Base(os.Args[0])
	}
	return "program"
}

// Shutdown ends the session (at process exit): the primary frees it at once.
func (d *Driver) Shutdown() {
	d.mu.Lock()
	c := d.client
	d.mu.Unlock()
	if c != nil {
		if os.Getenv("VGPUHA_STATS") == "1" || os.Getenv("VGPUHA_DEBUG") != "" {
			fmt.Fprintf(os.Stderr, "vgpuha libcuda: requests of this process, per opcode (the most time waited first):\n")
			pvdriver.WriteStats(os.Stderr, c.Stats())
			fmt.Fprintf(os.Stderr, "vgpuha libcuda: replies read by their caller's own thread: %d\n", c.OwnReplies())
			if m := &d.mapped; m.pulls.Load() > 0 || m.pushed.Load() > 0 {
				fmt.Fprintf(os.Stderr, "vgpuha libcuda: mapped host memory: %d waits read the mirrors back, %d bytes; %d bytes pushed\n",
					m.pulls.Load(), m.pulled.Load(), m.pushed.Load())
			}
			if fos := c.Failovers(); len(fos) > 0 {
				fmt.Fprintf(os.Stderr, "vgpuha libcuda: this process's failovers:\n")
				pvdriver.WriteFailovers(os.Stderr, fos)
			}
		}
		c.Close()
	}
	d.mu.Lock()
	d.closed = true
	d.changed()
	d.mu.Unlock()
}

// mint returns a fresh handle. Handles are multiples of 16 from 0x1000, so
// none equals CU_STREAM_LEGACY (1) or CU_STREAM_PER_THREAD (2).
// Precondition: d.mu must be locked.
func (d *Driver) mint() uint64 {
	if d.next == 0 {
		d.next = 0x1000
	}
	d.next += 16
	return d.next
}

// ready checks cuInit was called.
// Precondition: d.mu must be locked.
func (d *Driver) ready() Result {
	if !d.initialized {
		return ErrorNotInitialized
	}
	if d.closed {
		return ErrorDeinitialized
	}
	return Success
}

// current checks cuInit and that the calling thread has a live context,
// and returns it.
// Precondition: d.mu must be locked.
func (d *Driver) current(t Thread) (uint64, Result) {
	if r := d.ready(); r != Success {
		return 0, r
	}
	c := t.Top()
	if c == 0 {
		return 0, ErrorInvalidContext
	}
	if d.ctxs[c] == nil {
		return 0, ErrorContextDestroyed
	}
	return c, Success
}

// DriverGetVersion is cuDriverGetVersion (it needs no cuInit).
func (d *Driver) DriverGetVersion() int32 { return Version }

// device checks cuInit and the device ordinal: one of the visible
// devices (the node serves one, so a valid ordinal is 0).
func (d *Driver) device(dev int32) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.ready(); r != Success {
		return r
	}
	if dev < 0 || int(dev) >= len(d.visible) {
		return ErrorInvalidDevice
	}
	return Success
}

// DeviceGet is cuDeviceGet.
func (d *Driver) DeviceGet(ordinal int32) (int32, Result) {
	if r := d.device(ordinal); r != Success {
		return 0, r
	}
	return 0, Success
}

// DeviceGetCount is cuDeviceGetCount: the visible devices.
func (d *Driver) DeviceGetCount() (int32, Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.ready(); r != Success {
		return 0, r
	}
	return int32(len(d.visible)), Success
}

// DeviceName is cuDeviceGetName's string.
func (d *Driver) DeviceName(dev int32) (string, Result) {
	if r := d.device(dev); r != Success {
		return "", r
	}
	return d.dev.Name, Success
}

// DeviceAttribute is cuDeviceGetAttribute.
func (d *Driver) DeviceAttribute(attr, dev int32) (int32, Result) {
	if r := d.device(dev); r != Success {
		return 0, r
	}
	if attr <= 0 || int(attr) >= len(d.dev.Attrs) {
		return 0, ErrorInvalidValue
	}
	if v, ok := unservedFeatures[attr]; ok {
		return v, Success
	}
	return d.dev.Attrs[attr], Success
}

// unservedFeatures are the device attributes that announce a feature this
// driver does not serve (its entries answer CUDA_ERROR_NOT_SUPPORTED):
// they say 0 whatever the primary's GPU has, so libraries that look
// before they leap (PyTorch's allocator keeps to cuMemAlloc) choose what
// is served.
var unservedFeatures = map[int32]int32{
	83:  0, // CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY
	89:  0, // CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS
	103: 0, // CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED (no VMM handle export, vmm.go)
	104: 0, // CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_HANDLE_SUPPORTED
	105: 0, // CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_KMT_HANDLE_SUPPORTED
	107: 0, // CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED (cuMemCreate refuses compression)
	110: 0, // CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
	115: 0, // CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED
	128: 0, // CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED
	91:  0, // CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM (a kernel reaches host memory by its mirror's address: mapped.go)
}

// attr is device attribute a (zero when the node did not report it).
func (d *Driver) attr(a int) int32 {
	if a < len(d.dev.Attrs) {
		return d.dev.Attrs[a]
	}
	return 0
}

// DeviceTotalMem is cuDeviceTotalMem_v2.
func (d *Driver) DeviceTotalMem(dev int32) (uint64, Result) {
	if r := d.device(dev); r != Success {
		return 0, r
	}
	return d.dev.TotalMem, Success
}

// DeviceUUID is cuDeviceGetUuid.
func (d *Driver) DeviceUUID(dev int32) ([16]byte, Result) {
	if r := d.device(dev); r != Success {
		return [16]byte{}, r
	}
	return d.dev.UUID, Success
}

// DeviceComputeCapability is cuDeviceComputeCapability.
func (d *Driver) DeviceComputeCapability(dev int32) (major, minor int32, r Result) {
	if r := d.device(dev); r != Success {
		return 0, 0, r
	}
	return d.attr(75), d.attr(76), Success
}

// DeviceCanAccessPeer is cuDeviceCanAccessPeer: with one device there is
// no peer.
func (d *Driver) DeviceCanAccessPeer(dev, peer int32) (int32, Result) {
	if r := d.device(dev); r != Success {
		return 0, r
	}
	if r := d.device(peer); r != Success {
		return 0, r
	}
	return 0, Success
}
