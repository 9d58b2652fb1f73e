package shm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// The system calls: the guest's sealed memory file (memfd_create, seals,
// mmap, fstat), the descriptor passed over the unix socket (SCM_RIGHTS)
// and the doorbell writes.

// Options are a guest's ring sizes (zero: DefaultRing), how long its
// side spins waiting before it sleeps (zero: DefaultMaxSpin; at most
// SpinLimit) and its host-memory region (nil: none; see hostmem.go).
type Options struct {
	RequestRing, ReplyRing uint32
	MaxSpin                time.Duration
	HostMemory             *HostMemory
}

// Dial connects to the hypervisor's unix socket at path and sets up a
// shared-memory connection over it: it makes the area, sends it with its
// hello and waits for the hypervisor to accept.
func Dial(ctx context.Context, path string, opts Options) (*Conn, error) {
	req, rep := uint64(opts.RequestRing), uint64(opts.ReplyRing)
	if req == 0 {
		req = DefaultRing
	}
	if rep == 0 {
		rep = DefaultRing
	}
	if !validRing(req) || !validRing(rep) {
		return nil, fmt.Errorf("%w: ring sizes must be powers of two between %d and %d bytes", ErrHandshake, MinRing, MaxRing)
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	uc := nc.(*net.UnixConn)
	if dl, ok := ctx.Deadline(); ok {
		uc.SetDeadline(dl)
	}
	c, err := dialArea(uc, req, rep, opts.HostMemory)
	if err != nil {
		uc.Close()
		return nil, fmt.Errorf("setting up shared memory with %s: %w", path, err)
	}
	c.maxSpin = clampSpin(opts.MaxSpin)
	uc.SetDeadline(time.Time{})
	return c, nil
}

// dialArea makes the guest's area, sends it (and the host-memory region,
// if any) with the hello and reads the hypervisor's answer.
func dialArea(uc *net.UnixConn, req, rep uint64, host *HostMemory) (*Conn, error) {
	fd, area, err := sealedFile("vgpuha-shm", areaSize(req, rep))
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd) // the mappings keep the memory
	fds, hostBytes := []int{fd}, uint64(0)
	if host != nil {
		// Held until the hello is sent: a Close meanwhile must not close
		// the file whose number goes with it.
		host.mu.RLock()
		defer host.mu.RUnlock()
		if host.mem == nil {
			unix.Munmap(area)
			return nil, net.ErrClosed
		}
		fds, hostBytes = append(fds, host.fd), uint64(len(host.mem))
	}
	if _, _, err := uc.WriteMsgUnix(appendHello(nil, uint32(req), uint32(rep), hostBytes), unix.UnixRights(fds...), nil); err != nil {
		unix.Munmap(area)
		return nil, err
	}
	flags, err := readVerdict(uc)
	if err != nil {
		unix.Munmap(area)
		return nil, err
	}
	c, err := newConn(uc, area, req, rep, 1) // the guest consumes replies
	if err != nil {
		return nil, err
	}
	c.host.shared = host != nil && flags&verdictHostMemory != 0
	return c, nil
}

// sealedFile makes a memory file of size bytes, sealed against shrinking
// and growing (so the hypervisor's mapping can never lose pages under it),
// and maps it.
func sealedFile(name string, size uint64) (fd int, mem []byte, err error) {
	fd, err = unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, nil, fmt.Errorf("memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return -1, nil, fmt.Errorf("sizing %s: %w", name, err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		unix.Close(fd)
		return -1, nil, fmt.Errorf("sealing %s: %w", name, err)
	}
	mem, err = unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return -1, nil, fmt.Errorf("mapping %s: %w", name, err)
	}
	return fd, mem, nil
}

// NewHostMemory makes a guest's host-memory region of size bytes (a
// multiple of 4096, at most MaxHostMemory).
func NewHostMemory(size uint64) (*HostMemory, error) {
	if size == 0 || !validHostMemory(size) {
		return nil, fmt.Errorf("shm: a host-memory region must be a multiple of %d bytes, at most %d", hostMemoryAlign, uint64(MaxHostMemory))
	}
	fd, mem, err := sealedFile("vgpuha-hostmem", size)
	if err != nil {
		return nil, err
	}
	return &HostMemory{fd: fd, mem: mem}, nil
}

// Close unmaps the region and closes its file: nothing may touch its
// bytes afterwards. A hypervisor that mapped it keeps its own mapping
// until its connection ends.
func (h *HostMemory) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mem == nil {
		return nil
	}
	err := unix.Munmap(h.mem)
	unix.Close(h.fd)
	h.mem, h.fd = nil, -1
	return err
}

// The hypervisor's verdict: magic, status (0 accepted), then for a
// refusal the message's length (at most 256) and the message, for an
// acceptance flags (verdictHostMemory: the host-memory region was mapped).
const (
	verdictHeader     = 12
	verdictHostMemory = 1
)

func appendVerdict(b []byte, flags uint32, err error) []byte {
	b = le32(b, helloMagic)
	if err == nil {
		return le32(le32(b, 0), flags)
	}
	msg := err.Error()[:min(len(err.Error()), 256)]
	b = le32(le32(b, 1), uint32(len(msg)))
	return append(b, msg...)
}

// readVerdict reads the hypervisor's answer: the acceptance's flags, or
// why it refused.
func readVerdict(uc *net.UnixConn) (flags uint32, err error) {
	buf := make([]byte, verdictHeader+256)
	got := 0
	for got < verdictHeader {
		n, err := uc.Read(buf[got:verdictHeader])
		if err != nil {
			return 0, fmt.Errorf("reading the hypervisor's answer: %w", err)
		}
		got += n
	}
	if get32(buf, 0) != helloMagic {
		return 0, fmt.Errorf("%w: the socket's server does not speak shared memory", ErrHandshake)
	}
	if get32(buf, 4) == 0 {
		return get32(buf, 8), nil
	}
	want := verdictHeader + min(int(get32(buf, 8)), 256)
	for got < want {
		n, err := uc.Read(buf[got:want])
		if err != nil {
			break
		}
		got += n
	}
	return 0, fmt.Errorf("%w: the hypervisor refused: %s", ErrHandshake, buf[verdictHeader:got])
}

// newConn builds a Conn over area; consume is the ring this side reads
// (1 for the guest, 0 for the hypervisor). On error the area is unmapped.
func newConn(uc *net.UnixConn, area []byte, req, rep uint64, consume int) (*Conn, error) {
	in, err := newRing(area, consume, req, rep)
	if err != nil {
		unix.Munmap(area)
		return nil, err
	}
	out, _ := newRing(area, 1-consume, req, rep)
	c, err := newConnCore(uc, area, in, out)
	if err != nil {
		unix.Munmap(area)
		return nil, err
	}
	c.unmap = func(b []byte) { unix.Munmap(b) }
	return c, nil
}

// writeByte writes one doorbell byte to a non-blocking socket; a full
// socket buffer drops it (the peer has wake-ups queued already).
func writeByte(fd uintptr, b byte) {
	unix.Write(int(fd), bellBytes[b:b+1])
}

// bellBytes holds every byte value, so a doorbell's write needs no
// allocation.
var bellBytes = func() (b [256]byte) {
	for i := range b {
		b[i] = byte(i)
	}
	return b
}()

// ErrUnsupported is returned by Dial and NewListener where there is no
// shared-memory transport (not here: this is Linux).
var ErrUnsupported = errors.New("shm: the shared-memory transport needs Linux (memfd, SCM_RIGHTS); use unix:// or tcp://")
