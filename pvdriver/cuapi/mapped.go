package cuapi

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/vgpuha/vgpuha/pvdriver"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Mapped host memory: cuMemHostGetDevicePointer.
//
// On one machine a kernel reaches page-locked host memory over PCIe at the
// address cuMemHostGetDevicePointer gives. Here the GPU is on another host,
// so the address names a mirror: device memory of the session, the same
// size as the host buffer, kept equal to it at the points where CUDA's
// rules let a program see the difference:
//
//   - before the library hands the node device work (a launch, a copy, a
//     memset, a graph launch) or waits for the device, bytes the program
//     changed in its buffer since the mirror last agreed with it are
//     copied to the mirror;
//   - after every call that waits for the device (stream, event and
//     context synchronisation, a synchronous copy to the host), bytes the
//     device changed in the mirror are copied into the buffer, and bytes
//     the program changed meanwhile are kept. The mirrors are read behind
//     the wait, in its round trip (waitAndPull): a process whose libraries
//     asked for two mirrors once paid three round trips for every wait.
//
// A byte written by both sides between two such points keeps the
// device's value, where CUDA would leave it to whoever wrote last: the
// program raced its own kernel. (A push copies each run of changed bytes;
// past mirrorRuns runs it copies the span from the first to the last, so
// a device write inside that span since the last pull is then lost.) What does not work is what needs the two
// to meet while a kernel runs: a kernel that spins on a flag the host
// sets, or a host that polls a value a running kernel writes (NCCL's
// proxy does; it is not served). XLA's timer sets the flag its delay
// kernel spins on and then waits: the push before the wait carries the
// flag, but the node copies it on CUDA's legacy stream, which waits for
// the spinning kernel since every stream the node makes is a blocking one
// (measured on an H200 pair, 2026-11-29: the delay kernel still timed
// out); the node would have to make the streams the program asks to be
// non-blocking as such. The mirror is ordinary session memory:
// it is replicated, and after a failover it sits at the same address on
// the standby. Mirrors are bounded (mirrorLimit bytes per process) since
// each agreement point compares them.
//
// The mirror's address is not the buffer's: CU_DEVICE_ATTRIBUTE_
// CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM is not true here, and a program
// must ask for the device pointer (the CUDA runtime's
// cudaHostGetDevicePointer does).

// mirrorLimit bounds the bytes of host memory mirrored on the device, all
// buffers of the process together.
const mirrorLimit = 64 << 20

// mirrorRuns bounds the separate runs of changed bytes one push copies;
// past it the span from the first changed byte to the last goes at once.
const mirrorRuns = 16

// mirror is one host buffer's device copy.
type mirror struct {
	host   uintptr // the buffer
	dev    uint64  // the mirror's device address
	shadow []byte  // the bytes both last agreed on
	// version counts changes to shadow (pushes and pulls): a read of the
	// mirror taken at an older version may predate one (waitAndPull).
	version uint64
}

// mirrors are the process's mapped host buffers, by host address. Their
// own lock: a push or pull talks to the node while holding it, and the
// driver's lock is never taken inside it.
type mirrors struct {
	mu     sync.Mutex
	byHost map[uintptr]*mirror
	bytes  uint64
	count  atomic.Int32 // len(byHost), read without the lock
	// reading counts waits with mirror reads behind them in flight
	// (waitAndPull); while one is, a dropped mirror's device memory is
	// kept (freeing) so that the read still finds it: the node would
	// otherwise fail the whole wait for a free that overtook it.
	reading int
	freeing []uint64
	// pulls counts waits that read the mirrors back, pulled the bytes
	// they read; pushed counts bytes copied to mirrors (the stats line).
	pulls, pulled, pushed atomic.Uint64
}

// HostGetDevicePointer is cuMemHostGetDevicePointer_v2: the device address
// of p inside host memory this driver allocated or registered (its mirror,
// made on first use). flags must be 0.
func (d *Driver) HostGetDevicePointer(t Thread, p uintptr, flags uint32) (uint64, Result) {
	if flags != 0 || p == 0 {
		return 0, ErrorInvalidValue
	}
	d.mu.Lock()
	_, r := d.current(t)
	base, h, ok := d.hostAt(p)
	c := d.client
	d.mu.Unlock()
	if r != Success {
		return 0, r
	}
	if !ok {
		return 0, ErrorInvalidValue
	}
	m := &d.mapped
	m.mu.Lock()
	defer m.mu.Unlock()
	mi := m.byHost[base]
	if mi == nil {
		if m.bytes+h.size > mirrorLimit {
			fmt.Fprintf(os.Stderr, "vgpuha libcuda: cuMemHostGetDevicePointer: mapping %d more bytes of host memory would pass the library's %d (CUDA_ERROR_OUT_OF_MEMORY)\n", h.size, mirrorLimit)
			return 0, ErrorOutOfMemory
		}
		dev, r := d.MemAlloc(t, h.size)
		if r != Success {
			return 0, r
		}
		mi = &mirror{host: base, dev: dev, shadow: make([]byte, h.size)}
		copy(mi.shadow, hostBytes(base, h.size))
		if err := c.CopyHtoD(pvdriver.DevicePtr(dev), mi.shadow); err != nil {
			d.MemFree(t, dev)
			return 0, resultOf("cuMemHostGetDevicePointer", err, false)
		}
		if m.byHost == nil {
			m.byHost = map[uintptr]*mirror{}
		}
		m.byHost[base] = mi
		m.bytes += h.size
		m.count.Add(1)
	}
	return mi.dev + uint64(p-base), Success
}

// deviceAddress is p as the node knows it: a host address inside memory
// this driver pinned (which unified addressing lets a program hand to a
// copy or memset as a device address) becomes its mirror's; any other
// address is returned as it is, for the node to judge.
func (d *Driver) deviceAddress(t Thread, p uint64) uint64 {
	d.mu.Lock()
	pinned := false
	if p < d.base || p-d.base >= d.size { // outside the device window (most addresses are inside)
		_, _, pinned = d.hostAt(uintptr(p))
	}
	d.mu.Unlock()
	if !pinned {
		return p
	}
	if dev, r := d.HostGetDevicePointer(t, uintptr(p), 0); r == Success {
		return dev
	}
	return p
}

// mirrorArgs is args with each address inside pinned host memory that a
// kernel is handed (unified addressing lets a program pass one) replaced
// by the address in its mirror: an 8-byte argument, or an 8-byte-aligned
// word of a structure passed by value (cuBLAS's GEMM kernels take their
// operands' addresses in one; XLA's autotuner hands them pinned host
// buffers; abi.MapAddresses). Only values outside the device window and
// inside the span of pinned memory are looked up, so a word that is not an
// address is left alone unless it happens to equal one inside a pinned
// buffer of this process. An address kept anywhere else (in device memory)
// is not found: the primary's GPU may reach it where its node shares the
// buffer, a standby's cannot.
func (d *Driver) mirrorArgs(t Thread, args []abi.Arg) []abi.Arg {
	d.mu.Lock()
	base, size, lo, hi := d.base, d.size, d.hostLo, d.hostHi
	d.mu.Unlock()
	if hi == 0 { // no host memory pinned yet: the usual launch
		return args
	}
	return abi.MapAddresses(args, func(v uint64) uint64 {
		if (v >= base && v-base < size) || v < lo || v >= hi {
			return v // inside the device window, or outside every pinned buffer
		}
		return d.deviceAddress(t, v)
	})
}

// hostAt finds the host memory holding p.
// Precondition: d.mu must be locked.
func (d *Driver) hostAt(p uintptr) (uintptr, hostAlloc, bool) {
	i, found := slices.BinarySearch(d.hostBases, p)
	if !found {
		i-- // the last base below p: host memories never overlap
	}
	if i < 0 {
		return 0, hostAlloc{}, false
	}
	base := d.hostBases[i]
	if h := d.hosts[base]; uint64(p-base) < h.size {
		return base, h, true
	}
	return 0, hostAlloc{}, false
}

// dropMirror frees the mirror of host memory at base, if it has one (the
// buffer is being freed or unregistered).
func (d *Driver) dropMirror(base uintptr) {
	m := &d.mapped
	m.mu.Lock()
	mi := m.byHost[base]
	if mi != nil {
		delete(m.byHost, base)
		m.bytes -= uint64(len(mi.shadow))
		m.count.Add(-1)
		if m.reading > 0 {
			m.freeing = append(m.freeing, mi.dev) // freed when the reads in flight end
			mi = nil
		}
	}
	m.mu.Unlock()
	if mi != nil {
		d.freeMirror(mi.dev)
	}
}

// endRead ends a wait's reads of the mirrors (waitAndPull) and returns
// the mirrors dropped meanwhile, once no read is in flight, for the
// caller to free.
// Precondition: the mirrors' lock must be held.
func (m *mirrors) endRead() []uint64 {
	m.reading--
	if m.reading > 0 {
		return nil
	}
	freed := m.freeing
	m.freeing = nil
	return freed
}

// freeMirror frees a mirror's device memory (no context check: the
// buffer's owner is going away).
func (d *Driver) freeMirror(dev uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.client != nil {
		d.freeLocked(dev) // a failure leaves it allocated until the session ends
	}
}

// pushMirrors copies the bytes the program changed in its mapped buffers
// to their mirrors: called before device work is handed to the node.
func (d *Driver) pushMirrors(c *pvdriver.Client) Result {
	m := &d.mapped
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, mi := range m.byHost {
		host := hostBytes(mi.host, uint64(len(mi.shadow)))
		for _, run := range changedRuns(host, mi.shadow) {
			mi.version++
			m.pushed.Add(uint64(run[1] - run[0]))
			copy(mi.shadow[run[0]:run[1]], host[run[0]:run[1]])
			if err := c.CopyHtoD(pvdriver.DevicePtr(mi.dev+uint64(run[0])), mi.shadow[run[0]:run[1]]); err != nil {
				return resultOf("mapped host memory", err, false)
			}
		}
	}
	return Success
}

// take copies the bytes the device changed in the mirror (dev, read from
// it) into the program's buffer: those where dev differs from shadow.
// Precondition: the mirrors' lock must be held.
func (mi *mirror) take(dev []byte) {
	host := hostBytes(mi.host, uint64(len(mi.shadow)))
	for _, run := range changedRuns(dev, mi.shadow) {
		copy(host[run[0]:run[1]], dev[run[0]:run[1]])
	}
	mi.shadow = dev
	mi.version++
}

// waitAndPull runs wait, a call that waits for the device (named what in
// errors), with a read of every mirror sent behind it, so that the wait
// and the reads cost one round trip (pvdriver's ...ThenRead), then brings
// the program's buffers up to date (take). The mirrors' lock is not held
// across the wait, so other threads' pushes go on: a mirror pushed or
// pulled by another thread meanwhile (its version moved) is read again
// under the lock, since the read behind the wait may predate that.
//
// A wait that succeeds marks the streams it covers (a stream's handle, or
// coversAll) idle (idle.go).
func (d *Driver) waitAndPull(c *pvdriver.Client, what string, covers uint64, wait func([]pvdriver.Read) error) Result {
	if c == nil {
		return resultOf(what, wait(nil), false)
	}
	before := c.Sent()
	if d.mapped.count.Load() == 0 {
		r := resultOf(what, wait(nil), false)
		if r == Success {
			d.mu.Lock()
			d.markIdleLocked(c, covers, before+1)
			d.mu.Unlock()
		}
		return r
	}
	if r := d.pushMirrors(c); r != Success { // a flag a kernel spins on, set just before this wait
		return r
	}
	type taken struct {
		mi      *mirror
		version uint64
		dev     []byte
	}
	m := &d.mapped
	m.mu.Lock()
	m.reading++
	snap := make([]taken, 0, len(m.byHost))
	reads := make([]pvdriver.Read, 0, len(m.byHost))
	for _, mi := range m.byHost {
		t := taken{mi: mi, version: mi.version, dev: make([]byte, len(mi.shadow))}
		snap = append(snap, t)
		reads = append(reads, pvdriver.Read{Dst: t.dev, Src: pvdriver.DevicePtr(mi.dev)})
	}
	m.mu.Unlock()
	m.pulls.Add(1)
	for _, r := range reads {
		m.pulled.Add(uint64(len(r.Dst)))
	}
	err := wait(reads)
	m.mu.Lock()
	freed := m.endRead()
	defer func() {
		m.mu.Unlock()
		for _, dev := range freed {
			d.freeMirror(dev)
		}
	}()
	if err != nil {
		if re := (*pvdriver.ReadError)(nil); errors.As(err, &re) {
			return resultOf("mapped host memory", re.Err, false)
		}
		return resultOf(what, err, false)
	}
	for _, t := range snap {
		if m.byHost[t.mi.host] != t.mi {
			continue // unmapped meanwhile
		}
		if t.mi.version != t.version {
			if err := c.CopyDtoH(t.dev, pvdriver.DevicePtr(t.mi.dev)); err != nil {
				return resultOf("mapped host memory", err, false)
			}
		}
		t.mi.take(t.dev)
	}
	d.mu.Lock()
	d.markIdleLocked(c, covers, before+1+uint64(len(reads)))
	d.mu.Unlock()
	return Success
}

// beforeWork is called before device work goes to the node through c.
func (d *Driver) beforeWork(c *pvdriver.Client) Result {
	if d.mapped.count.Load() == 0 || c == nil {
		return Success
	}
	return d.pushMirrors(c)
}

// changedRuns returns the runs [start, end) where now differs from was
// (equal lengths); past mirrorRuns runs, one run from the first
// difference to the last.
func changedRuns(now, was []byte) [][2]int {
	if bytes.Equal(now, was) {
		return nil
	}
	var runs [][2]int
	for i := 0; i < len(now); {
		if now[i] == was[i] {
			i++
			continue
		}
		j := i
		for j < len(now) && now[j] != was[j] {
			j++
		}
		runs = append(runs, [2]int{i, j})
		i = j
	}
	if len(runs) > mirrorRuns {
		return [][2]int{{runs[0][0], runs[len(runs)-1][1]}}
	}
	return runs
}
