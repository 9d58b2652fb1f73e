//go:build !linux

package transport

import "net"

// widen does nothing where socket buffers are not tuned.
func widen(net.Conn, int) {}
