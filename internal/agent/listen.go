package agent

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vgpuha/vgpuha/internal/cli"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/pvdriver/transport"
)

// A node binds every address it listens on before it opens its GPU or
// starts anything, whatever its role, so a taken address stops it at
// once with the address and the flag named (exit 1): the admin address
// and a standby's replication address stay bound from then on; a guest
// endpoint is tried (bound and let go) — a standby serves guests only
// once promoted, and until then a guest must find nothing there.

// Two nodes on one host given the same unix guest socket would take it
// from each other: a standby only tries its endpoint at start (it serves
// there once promoted), so a second one started with the first one's path
// finds it free. Every node with a unix endpoint therefore claims its
// path for its whole life with an abstract unix socket named by the
// path's hash (Linux; per network namespace, gone with the process), and
// the second node refuses to start.

// claimGuestSocket claims a unix:// or shm+unix:// endpoint's path (nil
// for any other endpoint); the claim lasts until it is closed.
func claimGuestSocket(flagName, endpoint string) (io.Closer, error) {
	e, err := transport.Parse(endpoint)
	if err != nil || (e.Scheme != "unix" && e.Scheme != "shm+unix") {
		return nil, nil
	}
	path, err := filepath.Abs(e.Address)
	if err != nil {
		return nil, cli.Usage(fmt.Errorf("--%s %s: %w", flagName, endpoint, err))
	}
	sum := sha256.Sum256([]byte(path))
	ln, err := net.Listen("unix", "@vgpuha-guest-socket-"+hex.EncodeToString(sum[:16]))
	if errors.Is(err, syscall.EADDRINUSE) {
		return nil, cli.Usage(fmt.Errorf("--%s %s: another vgpuha node on this host has this socket path (a standby waiting to serve there, or a primary): "+
			"give each node its own --%s path", flagName, endpoint, flagName))
	}
	if err != nil {
		return nil, listenError(flagName, endpoint, err)
	}
	return ln, nil
}

// listenError names the flag and address a node could not listen on.
func listenError(flagName, addr string, err error) error {
	return fmt.Errorf("--%s %s: cannot listen: %w (stop whatever holds it, an old node perhaps, or choose another address)", flagName, addr, err)
}

// tryListen binds a guest endpoint and lets it go again.
func tryListen(flagName, endpoint string) error {
	ln, err := transport.Listen(endpoint)
	if err != nil {
		return listenError(flagName, endpoint, err)
	}
	return ln.Close() // a unix socket's file goes with it
}

// listenTCP binds a tcp://HOST:PORT flag's address and keeps it.
func listenTCP(flagName, addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, listenError(flagName, "tcp://"+addr, err)
	}
	return ln, nil
}

// listenAdmin binds --admin-listen (HOST:PORT or unix:///path; nil when
// empty). A guest that reaches it by mistake is told so at once
// (refuseGuests).
func listenAdmin(addr string) (net.Listener, error) {
	if addr == "" {
		return nil, nil
	}
	var ln net.Listener
	var err error
	if path, ok := strings.CutPrefix(addr, "unix://"); ok {
		if ln, err = transport.Listen(addr); err == nil {
			if err = os.Chmod(path, 0o600); err != nil { // who may connect is who may administer
				ln.Close()
			}
		}
	} else {
		ln, err = net.Listen("tcp", addr)
	}
	if err != nil {
		return nil, listenError("admin-listen", addr, err)
	}
	return refuseGuests{ln, "this is a vgpuha node's admin endpoint (--admin-listen), not a guest endpoint: guests connect to the node's --guest-listen"}, nil
}

// refuseGuests answers a connection that opens with a vgpuha frame (a
// guest's hello, sent to the wrong port) with an error reply saying what
// it reached, and closes it; every other connection passes through.
// Without it a guest waits for the HTTP server's header timeout (5 s),
// then reads HTTP where a frame should be.
type refuseGuests struct {
	net.Listener
	why string
}

func (l refuseGuests) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &sniffedConn{Conn: c, why: l.why}, nil
}

// sniffedConn looks at a connection's first bytes before its reader does.
type sniffedConn struct {
	net.Conn
	why  string
	once sync.Once
	head []byte // bytes read while sniffing, not yet handed to the reader
	err  error
}

func (c *sniffedConn) Read(p []byte) (int, error) {
	c.once.Do(c.sniff)
	if len(c.head) > 0 {
		n := copy(p, c.head)
		c.head = c.head[n:]
		return n, nil
	}
	if c.err != nil {
		return 0, c.err
	}
	return c.Conn.Read(p)
}

// sniff reads the first four bytes; vgpuha's frame magic gets the
// refusal.
func (c *sniffedConn) sniff() {
	head := make([]byte, abi.HeaderSize)
	n, err := io.ReadAtLeast(c.Conn, head, 4)
	c.head = head[:n]
	if err != nil {
		c.err = err
		return
	}
	if binary.LittleEndian.Uint32(head) != abi.Magic {
		return
	}
	c.Conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.ReadFull(c.Conn, head[n:]); err == nil {
		h, _ := abi.ParseHeader(head, abi.DefaultMaxPayload) // the version and request id, where readable
		if !abi.Supported(h.Version) {
			h.Version = abi.Version
		}
		c.Conn.Write(abi.AppendReplyFrame(nil, h.Version, abi.OpHello, h.RequestID, abi.StatusNotSupported, c.why, nil))
	}
	c.Conn.Close()
	c.head, c.err = nil, io.EOF
}
