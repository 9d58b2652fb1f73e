package pvdriver

import (
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/pvdriver/transport/shm"
	"github.com/vgpuha/vgpuha/uffd"
)

// ApertureKind says how the hypervisor traces writes to an aperture.
type ApertureKind = abi.ApertureKind

const (
	// Memory apertures hold data whose final contents matter (descriptor
	// rings, buffers): writes may be batched per page.
	Memory = abi.ApertureMemory
	// Register apertures are doorbells: every write matters, in order.
	Register = abi.ApertureRegister
)

// ErrAperturesUnsupported reports MapAperture on a system where the guest
// cannot share memory files with the hypervisor (anything but Linux).
var ErrAperturesUnsupported = errors.New("pvdriver: apertures are not supported on this system (they need Linux memfd)")

// Aperture is device memory mapped into the guest: Mem is shared with the
// hypervisor, which takes it as the contents of the allocation at Ptr. The
// guest writes Mem directly, with no call; the hypervisor catches the
// writes (package mmiotrace) and hands them to the device and the standby
// before the guest's next call, so a kernel launched after a write sees
// it. Device writes to an aperture's allocation are not reflected in Mem.
type Aperture struct {
	Ptr  DevicePtr
	Mem  []byte
	Kind ApertureKind
	// Mode is how the hypervisor traces writes (off, insn, page, uffd).
	Mode abi.ApertureMode

	c    *Client
	fd   int // the memfd, kept open for re-attaching after a failover
	uffd int // uffd mode: the write-tracking descriptor, or -1
}

// MapAperture allocates size bytes of device memory (rounded up to whole
// pages) and maps it into this process as an aperture. It needs a unix
// socket connection: the hypervisor takes the memory file from this
// process. Under the ptrace tracing modes this process must run in a
// process group of its own (vgpuha run does that).
func (c *Client) MapAperture(size uint64, kind ApertureKind) (*Aperture, error) {
	if kind != Memory && kind != Register {
		return nil, fmt.Errorf("pvdriver: unknown aperture kind %d", kind)
	}
	page := uint64(os.Getpagesize())
	size = (size + page - 1) &^ (page - 1)
	if size == 0 || size > 1<<34 {
		return nil, fmt.Errorf("pvdriver: aperture of %d bytes", size)
	}
	a := &Aperture{Kind: kind, c: c, fd: -1, uffd: -1}
	if err := a.mapFile(size); err != nil {
		a.release()
		return nil, err
	}
	ptr, err := c.Alloc(size)
	if err != nil {
		a.release()
		return nil, err
	}
	a.Ptr = ptr
	mode, err := c.attach(a)
	if err != nil {
		a.release()
		c.Free(ptr)
		return nil, err
	}
	a.Mode = mode
	if mode == abi.ApertureModeUffd && kind == Memory {
		if a.uffd, err = uffd.ArmWriteTracking(a.Mem); err != nil {
			a.release()
			c.Free(ptr)
			return nil, fmt.Errorf("pvdriver: the hypervisor traces apertures with userfaultfd: %w", err)
		}
	}
	c.mu.Lock()
	c.apertures = append(c.apertures, a)
	c.mu.Unlock()
	return a, nil
}

// attach hands the aperture's file to the node serving the session.
func (c *Client) attach(a *Aperture) (abi.ApertureMode, error) {
	c.mu.Lock()
	_, unixConn := c.conn.(*net.UnixConn)
	if _, viaShm := c.conn.(*shm.Conn); viaShm {
		unixConn = true // shared memory rides on a unix socket: the node finds this process the same way
	}
	c.mu.Unlock()
	if !unixConn {
		return 0, errors.New("pvdriver: apertures need a unix-socket connection to the hypervisor (shared memory)")
	}
	var r abi.ApertureReply
	err := c.call(abi.OpApertureAttach, &abi.ApertureAttach{Ptr: uint64(a.Ptr), Kind: a.Kind, FD: uint32(a.fd)}, &r)
	return r.Mode, err
}

// Close unmaps the aperture and frees its device memory.
func (a *Aperture) Close() error {
	c := a.c
	c.mu.Lock()
	for i, o := range c.apertures {
		if o == a {
			c.apertures = append(c.apertures[:i], c.apertures[i+1:]...)
			break
		}
	}
	c.mu.Unlock()
	a.release()
	return c.Free(a.Ptr)
}

// reattachFrames are the attach requests a resumed session needs first:
// the new node takes the files over and starts from their contents.
// Precondition: c.mu must be locked.
func (c *Client) reattachFrames() [][]byte {
	var frames [][]byte
	for _, a := range c.apertures {
		frames = append(frames, abi.AppendBodyFrame(nil, abi.OpApertureAttach, 0, 0,
			&abi.ApertureAttach{Ptr: uint64(a.Ptr), Kind: a.Kind, FD: uint32(a.fd)}))
	}
	return frames
}
