//go:build !linux

package pvdriver

import (
	"net"
	"time"
)

// sockWaiter exists on Linux only (sockwait_linux.go): elsewhere the
// reader goroutine reads every reply from a socket and hands it over.
type sockWaiter struct{}

func newSockWaiter(net.Conn, func() bool) *sockWaiter { return nil }

func (*sockWaiter) Read([]byte) (int, error) { return 0, nil }

func (*sockWaiter) watch(time.Duration, bool) (bool, error) { return false, nil }

func (*sockWaiter) wake() {}

func (*sockWaiter) close() {}
