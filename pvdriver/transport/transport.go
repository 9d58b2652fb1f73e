// Package transport turns an endpoint URL into a connection between a guest
// and the hypervisor. It owns endpoint syntax and nothing else: frames are
// package abi's business.
//
//	unix:///run/vgpuha/guest.sock   a co-located guest (the default)
//	shm+unix:///run/vgpuha/guest.sock
//	                                a co-located guest over shared memory:
//	                                request and reply rings in a sealed memory
//	                                file the guest hands over that socket
//	                                (package shm; Linux only). A node that
//	                                listens on shm+unix serves plain unix
//	                                guests on the same socket too.
//	shm+unix:///run/vgpuha/guest.sock?spin=200us
//	                                the same, this side spinning up to 200 µs
//	                                waiting for the other before it sleeps
//	                                (default 50 µs, at most 10 ms): a GPU
//	                                host with cores to spare catches a
//	                                guest's next call awake
//	shm+unix:///run/vgpuha/guest.sock?hostmem=1GiB
//	                                the same with a 1 GiB host-memory region
//	                                (the guest's page-locked memory, which the
//	                                node maps and page-locks with the GPU;
//	                                shm's hostmem.go): on a guest, the region
//	                                it asks for (default 256 MiB; 0 none); on
//	                                a node, what its guests' regions may hold
//	                                together (default 4 GiB; 0 none). Sizes
//	                                in bytes or with KiB, MiB or GiB
//	tcp://127.0.0.1:7070            a guest on another host, or tests
//	vsock://2:7070                  a VM guest talking to its host (CID 2);
//	                                a listener may use vsock://any:PORT
//
// A shared-memory connection carries the same frames as a socket, so a
// session opened over shm+unix resumes after a failover on whatever the
// guest's failover endpoints say (unix or tcp on another host).
//
// vsock uses github.com/mdlayher/vsock. It needs AF_VSOCK: inside a VM the
// vmw_vsock_virtio_transport module, on a host vhost_vsock.
package transport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/mdlayher/vsock"
	"github.com/vgpuha/vgpuha/pvdriver/transport/shm"
)

// Endpoint is a parsed endpoint URL.
type Endpoint struct {
	Scheme string // "unix", "shm+unix", "tcp" or "vsock"
	// Address is the socket path (unix, shm+unix) or host:port (tcp).
	Address string
	// CID and Port address a vsock endpoint; AnyCID listens on every CID.
	CID, Port uint32
	AnyCID    bool
	// Spin is how long a shared-memory side spins before it sleeps (zero:
	// the default).
	Spin time.Duration
	// HostMemory is the hostmem parameter of a shared-memory endpoint, in
	// bytes: zero when not given (the default), negative for none (0).
	HostMemory int64
}

func (e Endpoint) String() string {
	switch e.Scheme {
	case "unix":
		return e.Scheme + "://" + e.Address
	case "shm+unix":
		q := url.Values{}
		if e.Spin != 0 {
			q.Set("spin", e.Spin.String())
		}
		if e.HostMemory != 0 {
			q.Set("hostmem", strconv.FormatInt(max(e.HostMemory, 0), 10))
		}
		if len(q) > 0 {
			return e.Scheme + "://" + e.Address + "?" + q.Encode()
		}
		return e.Scheme + "://" + e.Address
	case "vsock":
		if e.AnyCID {
			return fmt.Sprintf("vsock://any:%d", e.Port)
		}
		return fmt.Sprintf("vsock://%d:%d", e.CID, e.Port)
	}
	return e.Scheme + "://" + e.Address
}

// ErrEndpoint is wrapped by every endpoint syntax error.
var ErrEndpoint = errors.New("bad endpoint")

// Parse parses an endpoint URL.
func Parse(s string) (Endpoint, error) {
	u, err := url.Parse(s)
	if err != nil {
		return Endpoint{}, fmt.Errorf("%w %q: %v", ErrEndpoint, s, err)
	}
	switch u.Scheme {
	case "unix", "shm+unix":
		p := u.Path
		if u.Host != "" { // unix://relative/path
			p = u.Host + u.Path
		}
		if p == "" {
			return Endpoint{}, fmt.Errorf("%w %q: want %s:///path/to/socket", ErrEndpoint, s, u.Scheme)
		}
		e := Endpoint{Scheme: u.Scheme, Address: p}
		if spin := u.Query().Get("spin"); spin != "" && u.Scheme == "shm+unix" {
			d, err := time.ParseDuration(spin)
			if err != nil || d < 0 || d > shm.SpinLimit {
				return Endpoint{}, fmt.Errorf("%w %q: spin wants a duration up to %v", ErrEndpoint, s, shm.SpinLimit)
			}
			e.Spin = d
		}
		if hm := u.Query().Get("hostmem"); hm != "" && u.Scheme == "shm+unix" {
			n, ok := parseSize(hm)
			if !ok || n > 1<<62 {
				return Endpoint{}, fmt.Errorf("%w %q: hostmem wants a size in bytes, KiB, MiB or GiB", ErrEndpoint, s)
			}
			e.HostMemory = int64(n)
			if n == 0 {
				e.HostMemory = -1
			}
		}
		return e, nil
	case "tcp":
		if _, _, err := net.SplitHostPort(u.Host); err != nil || u.Path != "" {
			return Endpoint{}, fmt.Errorf("%w %q: want tcp://host:port", ErrEndpoint, s)
		}
		return Endpoint{Scheme: "tcp", Address: u.Host}, nil
	case "vsock":
		host, port, err := net.SplitHostPort(u.Host)
		if err != nil || u.Path != "" {
			return Endpoint{}, fmt.Errorf("%w %q: want vsock://cid:port", ErrEndpoint, s)
		}
		p, err := strconv.ParseUint(port, 10, 32)
		if err != nil {
			return Endpoint{}, fmt.Errorf("%w %q: port: %v", ErrEndpoint, s, err)
		}
		e := Endpoint{Scheme: "vsock", Port: uint32(p)}
		if strings.EqualFold(host, "any") {
			e.AnyCID = true
			return e, nil
		}
		cid, err := strconv.ParseUint(host, 10, 32)
		if err != nil {
			return Endpoint{}, fmt.Errorf("%w %q: cid: %v", ErrEndpoint, s, err)
		}
		e.CID = uint32(cid)
		return e, nil
	}
	return Endpoint{}, fmt.Errorf("%w %q: scheme must be unix, shm+unix, tcp or vsock", ErrEndpoint, s)
}

// parseSize parses a byte count, optionally with a KiB, MiB or GiB suffix.
func parseSize(s string) (uint64, bool) {
	mult := uint64(1)
	for suffix, m := range map[string]uint64{"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30} {
		if rest, ok := strings.CutSuffix(s, suffix); ok {
			s, mult = rest, m
		}
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n > (1<<63)/mult {
		return 0, false
	}
	return n * mult, true
}

// NewHostMemory makes the host-memory region a guest dialling endpoint
// asks for (its hostmem parameter, default shm.DefaultHostMemory, rounded
// up to whole pages): nil for an endpoint that is not shm+unix or asks
// for none. The guest keeps it for its life and dials every connection
// with it (DialWith).
func NewHostMemory(endpoint string) (*shm.HostMemory, error) {
	e, err := Parse(endpoint)
	if err != nil || e.Scheme != "shm+unix" || e.HostMemory < 0 {
		return nil, err
	}
	n := uint64(e.HostMemory)
	if n == 0 {
		n = shm.DefaultHostMemory
	}
	const page = 4096
	return shm.NewHostMemory((n + page - 1) / page * page)
}

// Dial connects to endpoint.
func Dial(ctx context.Context, endpoint string) (net.Conn, error) {
	return DialWith(ctx, endpoint, nil)
}

// DialWith connects to endpoint handing it the guest's host-memory region
// (if the endpoint is shm+unix; other transports carry none).
func DialWith(ctx context.Context, endpoint string, host *shm.HostMemory) (net.Conn, error) {
	e, err := Parse(endpoint)
	if err != nil {
		return nil, err
	}
	switch e.Scheme {
	case "vsock":
		if e.AnyCID {
			return nil, fmt.Errorf("%w %q: dial needs a CID, not any", ErrEndpoint, endpoint)
		}
		c, err := vsock.DialContext(ctx, e.CID, e.Port, nil)
		if err != nil {
			return nil, fmt.Errorf("dialing %s: %w (inside a VM the vmw_vsock_virtio_transport module must be loaded)", e, err)
		}
		return c, nil
	case "tcp":
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", e.Address)
		if err != nil {
			return nil, err
		}
		c.(*net.TCPConn).SetNoDelay(true)
		return c, nil
	case "shm+unix":
		return shm.Dial(ctx, e.Address, shm.Options{MaxSpin: e.Spin, HostMemory: host})
	default:
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", e.Address)
		if err != nil {
			return nil, err
		}
		WidenBuffers(c)
		return c, nil
	}
}

// Listen listens on endpoint. A stale unix socket file left by a previous
// run is removed first; any other file at that path is an error.
func Listen(endpoint string) (net.Listener, error) {
	e, err := Parse(endpoint)
	if err != nil {
		return nil, err
	}
	switch e.Scheme {
	case "vsock":
		var l *vsock.Listener
		if e.AnyCID {
			l, err = vsock.Listen(e.Port, nil)
		} else {
			l, err = vsock.ListenContextID(e.CID, e.Port, nil)
		}
		if err != nil {
			return nil, fmt.Errorf("listening on %s: %w (a host needs the vhost_vsock module)", e, err)
		}
		return l, nil
	case "tcp":
		return net.Listen("tcp", e.Address)
	case "shm+unix":
		ln, err := listenUnix(e)
		if err != nil {
			return nil, err
		}
		sl, err := shm.NewListener(ln.(*net.UnixListener), 0)
		if err != nil {
			ln.Close()
			return nil, fmt.Errorf("listening on %s: %w", e, err)
		}
		sl.SetMaxSpin(e.Spin)
		switch { // zero: the default budget
		case e.HostMemory > 0:
			sl.SetHostMemoryBudget(e.HostMemory)
		case e.HostMemory < 0:
			sl.SetHostMemoryBudget(0)
		}
		return sl, nil
	default:
		return listenUnix(e)
	}
}

// listenUnix listens on a unix socket, replacing a stale socket file.
func listenUnix(e Endpoint) (net.Listener, error) {
	if fi, err := os.Lstat(e.Address); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("listening on %s: %s exists and is not a socket", e, e.Address)
		}
		if c, err := net.Dial("unix", e.Address); err == nil {
			c.Close()
			return nil, fmt.Errorf("listening on %s: another process is serving it", e)
		}
		os.Remove(e.Address)
	}
	return net.Listen("unix", e.Address)
}

// bulkBuffer is the socket buffer a guest connection over a unix socket
// asks for each way: a large copy's frame then crosses in a few system
// calls instead of one per default-sized buffer (about 200 KiB), each a
// wake-up of the other side. Measured on the 2-core VM, a 3 MiB reply
// over a bare unix socket took 0.38-0.43 ms with the default and 0.25 ms
// with 8 MiB. The kernel holds that much only while the peer has not read
// it: a guest that stops reading its replies costs its node at most
// bulkBuffer of kernel memory, until the write timeout drops it.
const bulkBuffer = 4 << 20

// WidenBuffers gives a guest connection over a unix socket the socket
// buffers of bulk copies (bulkBuffer, as far as the kernel allows); other
// connections are left as they are.
func WidenBuffers(c net.Conn) { widen(c, bulkBuffer) }
