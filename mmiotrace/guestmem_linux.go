package mmiotrace

import (
	"bufio"
	"fmt"
	"net"
	"os"
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
// guest maps it, and maps it here. mem and guestAddr are a Region's Mem
// and GuestAddr; release mem with UnmapGuestFile once the region is
// removed.
func MapGuestFile(pid, fd int, size uint64) (mem []byte, guestAddr uint64, err error) {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("guest process %d: %w", pid, err)
	}
	defer unix.Close(pidfd)
	own, err := unix.PidfdGetfd(pidfd, fd, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("taking file %d from the guest: %w", fd, err)
	}
	defer unix.Close(own)
	var st unix.Stat_t
	if err := unix.Fstat(own, &st); err != nil {
		return nil, 0, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || uint64(st.Size) != size {
		return nil, 0, fmt.Errorf("file %d is not a %d-byte memory file", fd, size)
	}
	seals, err := unix.FcntlInt(uintptr(own), unix.F_GET_SEALS, 0)
	if err != nil || seals&(unix.F_SEAL_SHRINK|unix.F_SEAL_GROW) != unix.F_SEAL_SHRINK|unix.F_SEAL_GROW {
		return nil, 0, fmt.Errorf("file %d is not a memfd sealed against shrinking and growing", fd)
	}
	addr, err := guestMapping(pid, st, size)
	if err != nil {
		return nil, 0, err
	}
	mem, err = unix.Mmap(own, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, 0, fmt.Errorf("mapping the aperture: %w", err)
	}
	return mem, addr, nil
}

// UnmapGuestFile releases a mapping MapGuestFile made.
func UnmapGuestFile(mem []byte) error { return unix.Munmap(mem) }

// guestMapping finds the guest's one shared, writable mapping of the whole
// file (inode st): that is the range the tracer watches. A second mapping
// would be written untraced, so it is refused.
func guestMapping(pid int, st unix.Stat_t, size uint64) (uint64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	dev := fmt.Sprintf("%02x:%02x", unix.Major(st.Dev), unix.Minor(st.Dev))
	var found []uint64
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
		if off != 0 || hi-lo != size || fields[1] != "rw-s" {
			return 0, fmt.Errorf("the guest maps the aperture file as %s %s at offset %d: map it once, whole, shared and writable", fields[0], fields[1], off)
		}
		found = append(found, lo)
	}
	if len(found) != 1 {
		return 0, fmt.Errorf("the guest maps the aperture file %d times: map it exactly once", len(found))
	}
	return found[0], nil
}
