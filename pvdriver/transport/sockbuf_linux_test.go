package transport

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestUnixConnectionsGetBulkBuffers: a guest's unix-socket connection asks
// for bulkBuffer each way, and gets it as far as the kernel's limits
// (net.core.wmem_max, rmem_max) allow: the kernel doubles what it grants.
func TestUnixConnectionsGetBulkBuffers(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "g.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			defer c.Close()
			c.Read(make([]byte, 1))
		}
	}()
	c, err := Dial(context.Background(), "unix://"+sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, tc := range []struct {
		opt   int
		limit string
	}{{unix.SO_SNDBUF, "wmem_max"}, {unix.SO_RCVBUF, "rmem_max"}} {
		b, err := os.ReadFile("/proc/sys/net/core/" + tc.limit)
		if err != nil {
			t.Skip("no", tc.limit)
		}
		limit, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		want := 2 * min(bulkBuffer, limit)
		if got := sockopt(t, c, tc.opt); got < want {
			t.Errorf("socket option %d: %d bytes, want %d (%s %d)", tc.opt, got, want, tc.limit, limit)
		}
	}
}

func sockopt(t *testing.T, c net.Conn, opt int) (v int) {
	t.Helper()
	rc, err := c.(*net.UnixConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	rc.Control(func(fd uintptr) { v, err = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, opt) })
	if err != nil {
		t.Fatal(err)
	}
	return v
}
