// Package shm is the shared-memory transport between a co-located guest and
// the hypervisor: two byte rings in a memory file the guest creates and
// hands over a unix socket (SCM_RIGHTS); that socket stays open for
// identity, liveness and doorbell bytes. A Conn is a net.Conn: the rings carry
// the same abi frames as a socket, so everything above the transport
// (framing, checksums, validation, exactly-once, resume on another host
// over unix or tcp) is unchanged.
//
// It owns the shared area's layout, the rings, the doorbells and the
// handshake. It never parses frames, and it never trusts the peer's half of
// the shared area: every index it reads from shared memory is loaded once
// into private memory, checked (a ring can never hold more than its size),
// and only the checked copy is used; its own indexes live in private memory
// and are only ever stored to the area, never read back. Read copies bytes
// out of the ring into the caller's private buffer before anyone looks at
// them, so a guest that rewrites the ring while it is read can only garble
// its own frames (caught by their checksums) or be told ErrCorrupt: either
// way only its own connection ends. ReadSpans instead hands a reader the
// bytes where they lie (a large copy's data, taken once by a device copy
// or a copy into a log buffer: see abi.InPlace); the reader must decide
// nothing from them.
//
// Layout of the area (little-endian; indexes are byte counts since the
// ring was made, never wrapped; a ring of size S holds bytes at index&(S-1)):
//
//	offset      size  what
//	0           256   request ring control (guest produces, hypervisor consumes)
//	256         256   reply ring control (hypervisor produces, guest consumes)
//	512         3584  reserved, zero
//	4096        R     request ring bytes (R a power of two)
//	4096+R      P     reply ring bytes (P a power of two)
//
// A guest's host-memory region, for its page-locked allocations, is a
// second memory file (hostmem.go).
//
// A ring's control block keeps each word on its own cache line: head
// (uint64, the producer's index) at 0, tail (uint64, the consumer's index)
// at 64, the consumer's "asleep" flag (uint32) at 128 and the producer's at
// 192. A side that finds nothing to do spins a little (adaptively: about
// twice its recent short waits, at most its connection's spin limit:
// DefaultMaxSpin, or what Options.MaxSpin or Listener.SetMaxSpin say, up
// to SpinLimit; in its first few microseconds it polls without yielding
// where the process has Ps to spare: busyPollSpan), then raises its flag,
// checks once more and sleeps until a doorbell byte arrives on the socket;
// the other side sends one only when the flag is up (and takes the flag
// down as it rings, so a burst rings once), so a busy pair makes no system
// call and an idle guest costs no CPU. The socket is read through Go's
// poller, so a sleeping side holds no OS thread. ReadStats counts each
// side's sleeps and doorbells, so a benchmark can tell calls caught
// spinning from calls that cost a wake-up.
//
// Shared memory exists on Linux only; elsewhere Dial and Listen return
// ErrUnsupported.
package shm

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// Layout constants (see the package doc).
const (
	ctlBytes      = 4096
	ringCtlBytes  = 256
	offHead       = 0
	offTail       = 64
	offDataSleep  = 128
	offSpaceSleep = 192
)

// Ring sizes a guest may ask for.
const (
	MinRing     = 64 << 10
	MaxRing     = 64 << 20
	DefaultRing = 4 << 20
)

// chunkBytes bounds one copy into or out of a ring before its index is
// published, so a large frame streams: the consumer copies the first chunk
// while the producer writes the next.
const chunkBytes = 256 << 10

// Spin bounds (see adapt). A host with cores to spare (a GPU server) may
// let its side spin longer between a guest's calls; SpinLimit bounds what
// anyone may ask, so a waiting side always sleeps in the end.
const (
	minSpin        = 1 * time.Microsecond
	DefaultMaxSpin = 50 * time.Microsecond
	SpinLimit      = 10 * time.Millisecond
)

// busyPollSpan is how long a waiting side polls before it first lets other
// goroutines run (runtime.Gosched), where the process has more than two
// Ps: a small synchronous call's reply comes within it, the device's time
// included (a 64-byte cuMemcpyHtoD takes 3-4 µs on an H100, and the reply
// 8-9 µs after the request). A Gosched puts the spinner
// on the scheduler's global queue under its lock and, with Ps idle, wakes
// another thread to look for work (a system call), several times per
// round trip; polling alone costs nothing another goroutine needs while
// Ps are idle, and where they are not, other goroutines wait at most this
// long. With one or two Ps (the guest and the node in one process, or a
// small VM), the peer or the goroutine that feeds it may be queued behind
// the spinner: it yields at once. Measured on an H100 host (bench pv
// --backend cuda, the two spans alternating, three runs each): a 64-byte
// synchronous copy over shared memory cost 1.62/1.70/1.59× the in-process
// call with 5 µs, 1.36/1.36/1.22× with 25 µs (the reply came while the
// guest was off its P).
const busyPollSpan = 25 * time.Microsecond

// pollWithoutYield is how long a wait polls before it first yields, in a
// process with procs Ps.
func pollWithoutYield(procs int) time.Duration {
	if procs > 2 {
		return busyPollSpan
	}
	return 0
}

// ErrCorrupt reports shared ring indexes no honest peer could have written.
// The connection is over.
var ErrCorrupt = errors.New("shm: the peer corrupted the shared ring indexes")

// ring is one direction of the area, seen from one side.
type ring struct {
	head, tail            *atomic.Uint64 // in shared memory
	dataSleep, spaceSleep *atomic.Uint32 // in shared memory
	data                  []byte         // shared ring bytes, len == size
	size                  uint64         // a power of two
	// pos is this side's own index (tail when consuming, head when
	// producing). It lives here, in private memory: the shared copy is
	// written, never read back.
	pos uint64
	// seenTail is the producer's private copy of the consumer's tail as
	// last loaded (and checked): the shared tail is loaded again only once
	// the room this copy leaves is used up, so a small write does not wait
	// for the line the consumer last wrote to cross between cores.
	seenTail uint64
	// spin is the adaptive spin budget before sleeping.
	spin time.Duration
}

// newRing lays ring number i (0 request, 1 reply) over area, whose
// request ring has reqSize bytes and reply ring repSize.
func newRing(area []byte, i int, reqSize, repSize uint64) (*ring, error) {
	ctl := area[i*ringCtlBytes : (i+1)*ringCtlBytes]
	r := &ring{size: reqSize, spin: DefaultMaxSpin / 2}
	start := uint64(ctlBytes)
	if i == 1 {
		r.size, start = repSize, ctlBytes+reqSize
	}
	r.data = area[start : start+r.size]
	var err error
	if r.head, err = word64(ctl, offHead); err != nil {
		return nil, err
	}
	r.tail, _ = word64(ctl, offTail)
	r.dataSleep, _ = word32(ctl, offDataSleep)
	r.spaceSleep, _ = word32(ctl, offSpaceSleep)
	return r, nil
}

// readable is how many published bytes the consumer has not taken. The
// shared head is loaded once; an impossible value is ErrCorrupt.
func (r *ring) readable() (uint64, error) {
	n := r.head.Load() - r.pos // wraps to a huge value if head < pos
	if n > r.size {
		return 0, ErrCorrupt
	}
	return n, nil
}

// writable is how many bytes the producer may write: the room left by
// the tail it saw last, or, if none, by the shared tail loaded once; an
// impossible value is ErrCorrupt.
func (r *ring) writable() (uint64, error) {
	if used := r.pos - r.seenTail; used < r.size {
		return r.size - used, nil
	}
	tail := r.tail.Load()
	used := r.pos - tail // wraps to a huge value if tail > pos
	if used > r.size {
		return 0, ErrCorrupt
	}
	r.seenTail = tail
	return r.size - used, nil
}

// take copies up to min(len(p), avail, chunkBytes) bytes out of the ring
// into p, then publishes the new tail. avail must come from readable.
func (r *ring) take(p []byte, avail uint64) int {
	n := min(uint64(len(p)), avail, chunkBytes)
	off := r.pos & (r.size - 1)
	k := copy(p[:n], r.data[off:])
	copy(p[k:n], r.data)
	r.pos += n
	r.tail.Store(r.pos)
	return int(n)
}

// put copies up to min(len(p), free, chunkBytes) bytes of p into the ring,
// then publishes the new head. free must come from writable.
func (r *ring) put(p []byte, free uint64) int {
	n := min(uint64(len(p)), free, chunkBytes)
	off := r.pos & (r.size - 1)
	k := copy(r.data[off:], p[:n])
	copy(r.data, p[k:n])
	r.pos += n
	r.head.Store(r.pos)
	return int(n)
}

// adapt sets the spin budget from how long a wait took: twice a short
// wait (so the next one like it is caught spinning), at most limit;
// halved after a long one (an idle peer: sleep at once).
func adapt(spin *time.Duration, waited, limit time.Duration) {
	if waited <= limit {
		*spin = min(limit, max(*spin, 2*waited, minSpin))
		return
	}
	*spin = max(minSpin, *spin/2)
}

// clampSpin turns an asked-for spin limit into one to use (zero: the
// default).
func clampSpin(d time.Duration) time.Duration {
	if d <= 0 {
		return DefaultMaxSpin
	}
	return min(d, SpinLimit)
}

// Hello is the guest's opening message on the unix socket, sent with the
// area's memory file attached (SCM_RIGHTS), and after it the host-memory
// region's file when the hello asks for one (hostmem.go):
//
//	offset size field
//	0      4    magic "VGSH"
//	4      2    version (1)
//	6      2    reserved, zero
//	8      4    request ring bytes (power of two, MinRing..MaxRing)
//	12     4    reply ring bytes (same rule)
//	16     8    host-memory region bytes (zero: none; else a multiple of
//	            4096, at most MaxHostMemory)
//	24     8    reserved, zero
//
// (A node older than the host-memory region refuses a hello that asks for
// one: the bytes were reserved.)
const (
	helloMagic   = 0x48534756 // "VGSH" little-endian
	helloVersion = 1
	helloBytes   = 32
)

// ErrHandshake is wrapped by every handshake refusal.
var ErrHandshake = errors.New("shm: bad handshake")

func appendHello(b []byte, req, rep uint32, host uint64) []byte {
	b = le32(b, helloMagic)
	b = le32(b, helloVersion)
	b = le32(b, req)
	b = le32(b, rep)
	b = le32(le32(b, uint32(host)), uint32(host>>32))
	return append(b, make([]byte, 8)...)
}

// decodeHello checks a guest's hello and returns its ring sizes and the
// size of the host-memory region it hands over (zero: none).
func decodeHello(b []byte) (req, rep, host uint64, err error) {
	if len(b) != helloBytes || get32(b, 0) != helloMagic {
		return 0, 0, 0, errors.Join(ErrHandshake, errors.New("not a shared-memory hello"))
	}
	if get32(b, 4) != helloVersion {
		return 0, 0, 0, errors.Join(ErrHandshake, errors.New("unsupported version or reserved bits set"))
	}
	for _, x := range b[24:] {
		if x != 0 {
			return 0, 0, 0, errors.Join(ErrHandshake, errors.New("reserved bytes set"))
		}
	}
	req, rep = uint64(get32(b, 8)), uint64(get32(b, 12))
	if !validRing(req) || !validRing(rep) {
		return 0, 0, 0, errors.Join(ErrHandshake, errors.New("ring sizes must be powers of two between 64 KiB and 64 MiB"))
	}
	host = uint64(get32(b, 16)) | uint64(get32(b, 20))<<32
	if !validHostMemory(host) {
		return 0, 0, 0, errors.Join(ErrHandshake, fmt.Errorf("a host-memory region must be a multiple of %d bytes, at most %d", hostMemoryAlign, uint64(MaxHostMemory)))
	}
	return req, rep, host, nil
}

func validRing(n uint64) bool { return n >= MinRing && n <= MaxRing && n&(n-1) == 0 }

// areaSize is the size of an area with rings of req and rep bytes.
func areaSize(req, rep uint64) uint64 { return ctlBytes + req + rep }

func le32(b []byte, v uint32) []byte {
	return append(b, byte(v), byte(v>>8), byte(v>>16), byte(v>>24))
}

func get32(b []byte, off int) uint32 {
	return uint32(b[off]) | uint32(b[off+1])<<8 | uint32(b[off+2])<<16 | uint32(b[off+3])<<24
}
