package pvdriver

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// mapFile creates the shared memory file, seals its size (so the
// hypervisor's mapping can never lose pages under it) and maps it, out of
// reach of children.
func (a *Aperture) mapFile(size uint64) error {
	fd, err := unix.MemfdCreate("vgpuha-aperture", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return fmt.Errorf("pvdriver: memfd_create: %w", err)
	}
	a.fd = fd
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return fmt.Errorf("pvdriver: sizing the aperture: %w", err)
	}
	// F_SEAL_SEAL stays off: the hypervisor adds F_SEAL_FUTURE_WRITE once
	// it mapped the file, so writes can only come through the mappings.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW); err != nil {
		return fmt.Errorf("pvdriver: sealing the aperture: %w", err)
	}
	if a.Mem, err = unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return fmt.Errorf("pvdriver: mapping the aperture: %w", err)
	}
	// A child would inherit a mapping no tracer watches.
	if err := unix.Madvise(a.Mem, unix.MADV_DONTFORK); err != nil {
		return fmt.Errorf("pvdriver: keeping the aperture from children: %w", err)
	}
	return nil
}

// release unmaps the aperture and closes its descriptors.
func (a *Aperture) release() {
	if a.Mem != nil {
		unix.Munmap(a.Mem)
		a.Mem = nil
	}
	if a.uffd >= 0 {
		unix.Close(a.uffd)
		a.uffd = -1
	}
	if a.fd >= 0 {
		unix.Close(a.fd)
		a.fd = -1
	}
}

// unprotectApertures makes the apertures writable again in this process
// when the connection to the node tracing them is lost: a tracer that died
// (with its host process) may have left pages write-protected, and a write
// to one would otherwise kill the guest with SIGSEGV. The node the session
// resumes on starts from the apertures' contents, so nothing written in
// between is lost.
// Precondition: c.mu must be locked.
func (c *Client) unprotectApertures() {
	for _, a := range c.apertures {
		unix.Mprotect(a.Mem, unix.PROT_READ|unix.PROT_WRITE)
	}
}
