package mmiotrace

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Reaching the guest's memory: which process is at the other end of a
// connection, and the memory file it shares as an aperture, mapped here.
// The checks below are what the tracer relies on: a region it traces is
// the guest's only writable mapping of the file, and the file can never
// shrink under this process's mapping.

// PeerPID is the process on the other end of a unix socket (SO_PEERCRED),
// or zero for any other connection.
func PeerPID(conn net.Conn) int {
	pid, _, _ := PeerCred(conn)
	return pid
}

// PeerCred is the process and user on the other end of a unix socket
// (SO_PEERCRED); ok is false for other connections.
func PeerCred(conn net.Conn) (pid, uid int, ok bool) {
	uc, isUnix := conn.(syscall.Conn) // a unix socket, or a transport over one (shared memory)
	if !isUnix {
		return 0, 0, false
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, 0, false
	}
	var cred *unix.Ucred
	raw.Control(func(fd uintptr) { cred, _ = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	if cred == nil {
		return 0, 0, false
	}
	return int(cred.Pid), int(cred.Uid), true
}

// MapGuestFile takes file descriptor fd from process pid (pidfd_getfd),
// checks it is a memory file of exactly size bytes sealed against resizing
// (so it can never shrink under this process's mapping), finds where the
// guest maps it, and maps it here, as a Region of the given kind to trace.
// Release r.Mem with UnmapGuestFile once the region is removed.
//
// It then seals the file against writes other than through existing
// mappings (F_SEAL_FUTURE_WRITE): write(2), pwrite(2),
// fallocate(PUNCH_HOLE) and madvise(MADV_REMOVE) on it fail with EPERM in
// the guest from then on, so nothing reaches the file behind the tracer.
// A file sealed so already (taken over after a failover) can only be
// mapped read-only here: the region is then traced without emulation.
// The guest's mapping must not be inherited by children (MADV_DONTFORK),
// whose writes no tracer would see: a child that touches it faults.
func MapGuestFile(pid, fd int, size uint64, kind Kind) (*Region, error) {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("guest process %d: %w", pid, err)
	}
	defer unix.Close(pidfd)
	own, err := unix.PidfdGetfd(pidfd, fd, 0)
	if err != nil {
		return nil, fmt.Errorf("taking file %d from the guest: %w", fd, err)
	}
	defer unix.Close(own)
	var st unix.Stat_t
	if err := unix.Fstat(own, &st); err != nil {
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || uint64(st.Size) != size {
		return nil, fmt.Errorf("file %d is not a %d-byte memory file", fd, size)
	}
	seals, err := unix.FcntlInt(uintptr(own), unix.F_GET_SEALS, 0)
	if err != nil || seals&(unix.F_SEAL_SHRINK|unix.F_SEAL_GROW) != unix.F_SEAL_SHRINK|unix.F_SEAL_GROW {
		return nil, fmt.Errorf("file %d is not a memfd sealed against shrinking and growing", fd)
	}
	writeSealed := seals&(unix.F_SEAL_WRITE|unix.F_SEAL_FUTURE_WRITE) != 0
	if !writeSealed && seals&unix.F_SEAL_SEAL != 0 {
		return nil, fmt.Errorf("file %d is sealed against further seals: leave F_SEAL_SEAL off, the hypervisor seals it against writes that bypass its mapping", fd)
	}
	addr, err := guestMapping(pid, st, size)
	var views []kmodView
	if errors.Is(err, errNotMapped) {
		// Traced by the kernel module before (a kmod mode on a node the
		// session left): the guest's mapping is the module's, and an
		// adopting tracer checks it is this file's (AddRegion).
		if views, err = kmodGuestViews(pid, size); err == nil {
			addr = views[0].addr
		}
	}
	if err != nil {
		return nil, err
	}
	prot := unix.PROT_READ | unix.PROT_WRITE
	if writeSealed {
		prot = unix.PROT_READ
	}
	mem, err := unix.Mmap(own, 0, int(size), prot, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mapping the aperture: %w", err)
	}
	if !writeSealed {
		if _, err := unix.FcntlInt(uintptr(own), unix.F_ADD_SEALS, unix.F_SEAL_FUTURE_WRITE); err != nil {
			unix.Munmap(mem)
			return nil, fmt.Errorf("sealing the aperture file against writes: %w", err)
		}
	}
	return &Region{GuestAddr: addr, Mem: mem, Kind: kind, readOnly: writeSealed, ino: st.Ino, kmodViews: views}, nil
}

// UnmapGuestFile releases a mapping MapGuestFile made.
func UnmapGuestFile(mem []byte) error { return unix.Munmap(mem) }

// errNotMapped: the guest does not map the aperture file.
var errNotMapped = errors.New("the guest does not map the aperture file: map it exactly once")

// guestMapping finds the guest's one shared, writable mapping of the whole
// file (inode st): that is the range the tracer watches. A second mapping
// would be written untraced, so it is refused.
func guestMapping(pid int, st unix.Stat_t, size uint64) (uint64, error) {
	var found []uint64
	var bad error
	err := fileMappings(pid, st, func(lo, hi uint64, perms string, off uint64) {
		if off != 0 || hi-lo != size || perms != "rw-s" {
			bad = fmt.Errorf("the guest maps the aperture file as %x-%x %s at offset %d: map it once, whole, shared and writable", lo, hi, perms, off)
		}
		found = append(found, lo)
	})
	switch {
	case err != nil:
		return 0, err
	case bad != nil:
		return 0, bad
	case len(found) == 0:
		return 0, errNotMapped
	}
	if len(found) != 1 {
		return 0, fmt.Errorf("the guest maps the aperture file %d times: map it exactly once", len(found))
	}
	if !dontFork(pid, found[0]) {
		return 0, errors.New("the guest's aperture mapping would be inherited by its children, whose writes no tracer sees: madvise it MADV_DONTFORK")
	}
	return found[0], nil
}

// fileMappings calls fn for each of the guest's mappings of the file st
// describes (by device and inode): its bounds, permissions and offset.
func fileMappings(pid int, st unix.Stat_t, fn func(lo, hi uint64, perms string, off uint64)) error {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return err
	}
	defer f.Close()
	dev := fmt.Sprintf("%02x:%02x", unix.Major(st.Dev), unix.Minor(st.Dev))
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// start-end perms offset dev inode path
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 || fields[4] != fmt.Sprint(st.Ino) || fields[3] != dev {
			continue
		}
		var lo, hi, off uint64
		fmt.Sscanf(fields[0], "%x-%x", &lo, &hi)
		fmt.Sscanf(fields[2], "%x", &off)
		fn(lo, hi, fields[1], off)
	}
	return sc.Err()
}

// dontFork reports whether the guest's mapping at addr is left out of its
// children (MADV_DONTFORK: "dc" in its smaps VmFlags).
func dontFork(pid int, addr uint64) bool {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return false
	}
	defer f.Close()
	head := fmt.Sprintf("%x-", addr)
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 0:
		case !strings.HasSuffix(f[0], ":"): // a mapping's header line: start-end perms ...
			in = strings.HasPrefix(f[0], head)
		case in && f[0] == "VmFlags:":
			return slices.Contains(f[1:], "dc")
		}
	}
	return false
}
