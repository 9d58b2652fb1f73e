package shm

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Listener serves both kinds of guest on one unix socket: a connection
// that opens with a shared-memory hello becomes a *Conn; any other is
// handed on as a plain unix connection, its opening bytes replayed.
type Listener struct {
	ln       *net.UnixListener
	conns    chan net.Conn
	done     chan struct{}
	once     sync.Once
	err      error // why accepting stopped; read after done is closed
	live     atomic.Int64
	maxConns int64
	maxSpin  atomic.Int64 // nanoseconds; see SetMaxSpin
	host     hostBudget   // what the open connections' host-memory regions hold
}

// SetHostMemoryBudget bounds the host-memory regions (hostmem.go) that
// connections accepted from now on may hold together, in bytes (zero: no
// regions; negative: DefaultHostMemoryBudget). The hypervisor page-locks
// them: this is what guests can make the node pin.
func (l *Listener) SetHostMemoryBudget(n int64) {
	if n < 0 {
		n = DefaultHostMemoryBudget
	}
	l.host.limit.Store(n)
}

// HostMemoryInUse is what the open connections' regions hold, in bytes.
func (l *Listener) HostMemoryInUse() int64 { return l.host.used.Load() }

// SetMaxSpin sets how long the node's side of connections accepted from
// now on spins waiting for a guest before it sleeps (zero: DefaultMaxSpin;
// at most SpinLimit). A GPU host with cores to spare may spin longer, so a
// guest's next call finds it awake.
func (l *Listener) SetMaxSpin(d time.Duration) { l.maxSpin.Store(int64(clampSpin(d))) }

// DefaultMaxConns bounds a listener's open shared-memory connections:
// each maps an area of its guest's (up to 2*MaxRing bytes) into this
// process.
const DefaultMaxConns = 256

// handshakeTimeout bounds how long a new connection may take to say what
// it is (and, for shared memory, to hand its area over).
const handshakeTimeout = 10 * time.Second

// NewListener serves guests accepted on ln; at most maxConns shared-memory
// connections are open at once (0: DefaultMaxConns).
func NewListener(ln *net.UnixListener, maxConns int) (*Listener, error) {
	if maxConns <= 0 {
		maxConns = DefaultMaxConns
	}
	l := &Listener{ln: ln, conns: make(chan net.Conn), done: make(chan struct{}), maxConns: int64(maxConns)}
	l.host.limit.Store(DefaultHostMemoryBudget)
	go l.acceptLoop()
	return l, nil
}

func (l *Listener) acceptLoop() {
	for {
		uc, err := l.ln.AcceptUnix()
		if err != nil {
			l.stop(err)
			return
		}
		go func() {
			c, err := l.handshake(uc)
			if err != nil {
				uc.Close()
				return
			}
			select {
			case l.conns <- c:
			case <-l.done:
				c.Close()
			}
		}()
	}
}

func (l *Listener) stop(err error) {
	l.once.Do(func() {
		l.err = err
		close(l.done)
	})
}

// Accept returns the next guest connection: a *Conn or a plain unix one.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, l.err
	}
}

// Close stops listening; open connections stay.
func (l *Listener) Close() error {
	err := l.ln.Close()
	l.stop(net.ErrClosed)
	return err
}

// Addr is the socket's address.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// handshake reads a new connection's opening bytes (with any descriptor
// that came with them) and sets up shared memory if it asks for it.
func (l *Listener) handshake(uc *net.UnixConn) (net.Conn, error) {
	uc.SetDeadline(time.Now().Add(handshakeTimeout))
	buf := make([]byte, helloBytes)
	oob := make([]byte, unix.CmsgSpace(8)) // two descriptors; the kernel drops any more
	got, fds := 0, []int(nil)
	for got < 4 || (got < helloBytes && get32(buf, 0) == helloMagic) {
		n, oobn, _, _, err := uc.ReadMsgUnix(buf[got:], oob)
		fds = append(fds, rights(oob[:oobn])...)
		got += n
		if err != nil {
			closeFDs(fds)
			return nil, err
		}
	}
	if get32(buf, 0) != helloMagic {
		closeFDs(fds) // a plain guest has no business passing descriptors
		uc.SetDeadline(time.Time{})
		return &prefixConn{UnixConn: uc, pre: buf[:got]}, nil
	}
	c, err := l.accept(uc, buf, fds)
	var flags uint32
	if c != nil && c.host.mem != nil {
		flags = verdictHostMemory
	}
	uc.Write(appendVerdict(nil, flags, err))
	if err != nil {
		return nil, err
	}
	uc.SetDeadline(time.Time{})
	return c, nil
}

// accept checks a hello and its memory files and maps the area (and the
// host-memory region, if the budget has room). It closes every descriptor
// in fds.
func (l *Listener) accept(uc *net.UnixConn, hello []byte, fds []int) (*Conn, error) {
	defer closeFDs(fds)
	req, rep, host, err := decodeHello(hello)
	if err != nil {
		return nil, err
	}
	if want := 1 + min(host, 1); uint64(len(fds)) != want {
		return nil, fmt.Errorf("%w: want %d memory files with the hello, got %d descriptors", ErrHandshake, want, len(fds))
	}
	area, err := mapGuestArea(fds[0], areaSize(req, rep))
	if err != nil {
		return nil, err
	}
	if l.live.Add(1) > l.maxConns {
		l.live.Add(-1)
		unix.Munmap(area)
		return nil, fmt.Errorf("%w: this node already serves %d shared-memory guests; connect over unix:// instead", ErrHandshake, l.maxConns)
	}
	region, err := l.mapHostMemory(fds, host)
	if err != nil {
		l.live.Add(-1)
		unix.Munmap(area)
		return nil, err
	}
	c, err := newConn(uc, area, req, rep, 0) // the hypervisor consumes requests
	if err != nil {
		l.live.Add(-1)
		region.release()
		return nil, err
	}
	c.host, c.stats = region, &nodeStats
	c.unmap = func(b []byte) { // Close, with c.mu held
		unix.Munmap(b)
		c.host.dropUntaken()
	}
	c.onClose = func() { l.live.Add(-1) }
	if d := l.maxSpin.Load(); d != 0 {
		c.maxSpin = time.Duration(d)
	}
	return c, nil
}

// mapHostMemory maps the guest's host-memory region (fds[1], host bytes)
// if the listener's budget has room for it. A region over the budget is
// left unmapped, not refused: the guest's copies then travel inline.
func (l *Listener) mapHostMemory(fds []int, host uint64) (hostRegion, error) {
	if host == 0 || !l.host.take(int64(host)) {
		return hostRegion{release: func() {}}, nil
	}
	mem, err := mapGuestArea(fds[1], host)
	if err != nil {
		l.host.give(int64(host))
		return hostRegion{}, err
	}
	return hostRegion{mem: mem, release: sync.OnceFunc(func() {
		unix.Munmap(mem)
		l.host.give(int64(host))
	})}, nil
}

// mapGuestArea maps a guest's memory file after checking it is a regular
// file of exactly size bytes sealed against shrinking and growing: the
// guest can change its bytes at will, but never take pages away from
// under this mapping (a SIGBUS would kill the node).
func mapGuestArea(fd int, size uint64) ([]byte, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("%w: fstat of the area: %v", ErrHandshake, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || uint64(st.Size) != size {
		return nil, fmt.Errorf("%w: the area must be a memory file of exactly %d bytes", ErrHandshake, size)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals&(unix.F_SEAL_SHRINK|unix.F_SEAL_GROW) != unix.F_SEAL_SHRINK|unix.F_SEAL_GROW {
		return nil, fmt.Errorf("%w: the area's memory file must be sealed against shrinking and growing (memfd_create with MFD_ALLOW_SEALING, then F_ADD_SEALS)", ErrHandshake)
	}
	area, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("%w: mapping the area: %v", ErrHandshake, err)
	}
	return area, nil
}

// prefixConn is a plain unix connection whose opening bytes were read to
// tell it from a shared-memory one.
type prefixConn struct {
	*net.UnixConn
	pre []byte
}

func (p *prefixConn) Read(b []byte) (int, error) {
	if len(p.pre) > 0 {
		n := copy(b, p.pre)
		p.pre = p.pre[n:]
		return n, nil
	}
	return p.UnixConn.Read(b)
}

// rights returns the descriptors passed in a control message.
func rights(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for _, m := range msgs {
		if f, err := unix.ParseUnixRights(&m); err == nil {
			fds = append(fds, f...)
		}
	}
	return fds
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
