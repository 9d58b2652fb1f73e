// Package linktest gives tests two authenticated ends of a replication
// link over loopback TCP. Tests import it; the product never does.
package linktest

import (
	"net"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/replicate/link"
)

// Pair returns two authenticated link ends over a real TCP connection.
func Pair(t testing.TB, primaryKey, standbyKey []byte) (p, s *link.Conn, perr, serr error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		l   *link.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			ch <- res{nil, err}
			return
		}
		l, err := link.ServerHandshake(c, standbyKey, 2*time.Second)
		if err != nil {
			c.Close()
		}
		ch <- res{l, err}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	p, perr = link.ClientHandshake(c, primaryKey, 2*time.Second)
	r := <-ch
	if r.l != nil {
		t.Cleanup(func() { r.l.Raw.Close() })
	}
	return p, r.l, perr, r.err
}
