package transport

import (
	"net"

	"golang.org/x/sys/unix"
)

// widen asks the kernel for socket buffers of n bytes each way on a
// unix-socket connection (the kernel caps them at net.core.wmem_max and
// rmem_max); other connections are left alone: TCP tunes its own.
func widen(c net.Conn, n int) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return
	}
	rc, err := uc.SyscallConn()
	if err != nil {
		return
	}
	rc.Control(func(fd uintptr) {
		unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, n) // best effort: the default still works
		unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, n)
	})
}
