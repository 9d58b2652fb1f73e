//go:build linux

package ptrace

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The ptrace requests that pass the kernel a pointer, and the reads of
// kernel structures by offset. Offsets are those of 64-bit Linux
// (include/uapi/asm-generic/siginfo.h).

// ptraceRaw issues a ptrace request whose data is a pointer. The pointer
// stays an unsafe.Pointer until the system call itself, so the object
// cannot move or die before the kernel is done with it.
func ptraceRaw(req, tid int, addr uintptr, data unsafe.Pointer) error {
	_, _, e := unix.Syscall6(unix.SYS_PTRACE, uintptr(req), uintptr(tid), addr, uintptr(data), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// ptraceGetRegset reads register set note (an NT_* value) of stopped
// thread tid into buf (PTRACE_GETREGSET) and returns how many bytes the
// kernel filled.
func ptraceGetRegset(tid int, note uintptr, buf []byte) (int, error) {
	iov := unix.Iovec{Base: &buf[0]}
	iov.SetLen(len(buf))
	if err := ptraceRaw(unix.PTRACE_GETREGSET, tid, note, unsafe.Pointer(&iov)); err != nil {
		return 0, err
	}
	return int(iov.Len), nil
}

// siginfoPID reads si_pid from a SIGCHLD siginfo (offset 16 on 64-bit).
func siginfoPID(info *unix.Siginfo) int32 {
	return *(*int32)(unsafe.Add(unsafe.Pointer(info), 16))
}

// getSiginfo reads the siginfo of the signal that stopped thread tid
// (PTRACE_GETSIGINFO).
func getSiginfo(tid int) (siginfo, error) {
	var raw [128]byte
	if err := ptraceRaw(unix.PTRACE_GETSIGINFO, tid, 0, unsafe.Pointer(&raw[0])); err != nil {
		return siginfo{}, err
	}
	// si_signo, si_errno, si_code (int32 each), then the union at 16:
	// si_pid for kill/tgkill, si_addr for faults.
	return siginfo{
		code: *(*int32)(unsafe.Pointer(&raw[8])),
		pid:  *(*int32)(unsafe.Pointer(&raw[16])),
		addr: *(*uint64)(unsafe.Pointer(&raw[16])),
	}, nil
}

// rawInfo is a siginfo as the kernel keeps it.
type rawInfo [128]byte

// getRawSiginfo and setRawSiginfo read and replace the siginfo of the
// signal that stopped thread tid (PTRACE_GETSIGINFO, PTRACE_SETSIGINFO):
// the siginfo a signal kept while its thread was stepped is put back
// before it is delivered.
func getRawSiginfo(tid int) (*rawInfo, error) {
	info := new(rawInfo)
	if err := ptraceRaw(unix.PTRACE_GETSIGINFO, tid, 0, unsafe.Pointer(info)); err != nil {
		return nil, err
	}
	return info, nil
}

func setRawSiginfo(tid int, info *rawInfo) error {
	return ptraceRaw(unix.PTRACE_SETSIGINFO, tid, 0, unsafe.Pointer(info))
}
