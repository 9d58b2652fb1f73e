package shm

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"path/filepath"
	"testing"
	"time"
)

// pair returns a guest end and a hypervisor end over a fresh socket.
func pair(t testing.TB, opts Options) (guest *Conn, host net.Conn) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.sock")
	ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln, _ := NewListener(ul, 0)
	t.Cleanup(func() { ln.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	guest, err = Dial(ctx, path, opts)
	if err != nil {
		t.Fatal(err)
	}
	host, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { guest.Close(); host.Close() })
	return guest, host
}

func TestRoundTripAndStreaming(t *testing.T) {
	g, h := pair(t, Options{RequestRing: MinRing, ReplyRing: MinRing})
	if _, ok := h.(*Conn); !ok {
		t.Fatalf("host got %T, want *Conn", h)
	}
	// Far more than a ring holds, so it streams in chunks both ways.
	big := make([]byte, 5<<20+123)
	for i := range big {
		big[i] = byte(i * 7)
	}
	go func() { // echo
		io.CopyN(h, h, int64(len(big)))
	}()
	errc := make(chan error, 1)
	go func() { _, err := g.Write(big); errc <- err }()
	got := make([]byte, len(big))
	if _, err := io.ReadFull(g, got); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, big) {
		t.Fatal("echoed bytes differ")
	}
}

func TestPeerCloseDrainsThenEOF(t *testing.T) {
	g, h := pair(t, Options{})
	if _, err := h.Write([]byte("last words")); err != nil {
		t.Fatal(err)
	}
	h.Close()
	b, err := io.ReadAll(g)
	if err != nil || string(b) != "last words" {
		t.Fatalf("ReadAll = %q, %v", b, err)
	}
	if _, err := g.Write([]byte("x")); err == nil {
		t.Fatal("write to a closed peer succeeded")
	}
}

func TestDeadlineAndClose(t *testing.T) {
	g, h := pair(t, Options{})
	h.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	var b [1]byte
	_, err := h.Read(b[:])
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read past deadline: %v, want a timeout", err)
	}
	h.SetReadDeadline(time.Time{})
	done := make(chan error, 1)
	go func() { _, err := h.Read(b[:]); done <- err }()
	time.Sleep(10 * time.Millisecond)
	h.Close()
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read on a closed conn: %v, want net.ErrClosed", err)
	}
	_ = g
}

func TestPlainGuestOnSameSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	ul, _ := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	ln, _ := NewListener(ul, 0)
	defer ln.Close()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("VGPU plain frame bytes"))
	h, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if _, ok := h.(*Conn); ok {
		t.Fatal("a plain guest got a shared-memory conn")
	}
	got := make([]byte, 22)
	if _, err := io.ReadFull(h, got); err != nil || string(got) != "VGPU plain frame bytes" {
		t.Fatalf("replayed %q, %v", got, err)
	}
}

// TestCorruptIndexesEndOnlyThatConn: a guest that writes an impossible
// head gets ErrCorrupt on its own connection; another is unaffected.
func TestCorruptIndexesEndOnlyThatConn(t *testing.T) {
	bad, badHost := pair(t, Options{})
	good, goodHost := pair(t, Options{})
	bad.out.head.Store(1 << 40) // the guest claims more than its ring holds
	bad.ring(bellData)
	var b [16]byte
	if _, err := badHost.Read(b[:]); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("host read of a corrupted ring: %v, want ErrCorrupt", err)
	}
	good.Write([]byte("fine"))
	if _, err := io.ReadFull(goodHost, b[:4]); err != nil || string(b[:4]) != "fine" {
		t.Fatalf("other guest: %q, %v", b[:4], err)
	}
	// The corrupting guest sees its connection end.
	bad.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := bad.Read(b[:]); err != io.EOF {
		t.Fatalf("corrupting guest's read: %v, want EOF", err)
	}
}

// TestScribbledAreaNeverCrashes: random bytes over the whole area while
// traffic runs: reads and writes end in an error or garbled bytes, never
// a crash or a hang.
func TestScribbledAreaNeverCrashes(t *testing.T) {
	g, h := pair(t, Options{RequestRing: MinRing, ReplyRing: MinRing})
	area := g.SharedMemory()
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		r := rand.New(rand.NewPCG(1, 2))
		for {
			select {
			case <-stop:
				return
			default:
			}
			i := r.IntN(len(area) - 8)
			area[i] = byte(r.Uint32())
			if r.IntN(8) == 0 { // now and then an index
				copy(area[r.IntN(2)*ringCtlBytes+r.IntN(2)*offTail:], []byte{byte(r.Uint32()), byte(r.Uint32()), 0, 0, 0, 0, 0, 0})
			}
		}
	}()
	defer func() { close(stop); <-stopped }() // before the area is unmapped
	h.SetDeadline(time.Now().Add(2 * time.Second))
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := h.Read(buf)
			if err != nil {
				return
			}
			if _, err := h.Write(buf[:n]); err != nil {
				return
			}
		}
	}()
	g.SetDeadline(time.Now().Add(2 * time.Second))
	msg := bytes.Repeat([]byte("abcdefgh"), 1024)
	buf := make([]byte, len(msg))
	for i := 0; i < 200; i++ {
		if _, err := g.Write(msg); err != nil {
			break
		}
		if _, err := io.ReadFull(g, buf); err != nil {
			break
		}
	}
}

func TestHandshakeRefusals(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	ul, _ := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	ln, _ := NewListener(ul, 1)
	defer ln.Close()
	ctx := context.Background()
	if _, err := Dial(ctx, path, Options{RequestRing: 1000}); !errors.Is(err, ErrHandshake) {
		t.Fatalf("bad ring size: %v", err)
	}
	// A hello without its memory file is refused with a reason.
	c, _ := net.Dial("unix", path)
	c.Write(appendHello(nil, MinRing, MinRing, 0))
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := readVerdict(c.(*net.UnixConn)); !errors.Is(err, ErrHandshake) {
		t.Fatalf("hello without a file: %v", err)
	}
	c.Close()
	// One connection allowed: the second is refused.
	a, err := Dial(ctx, path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := Dial(ctx, path, Options{}); !errors.Is(err, ErrHandshake) {
		t.Fatalf("over the connection limit: %v", err)
	}
}

// BenchmarkRoundTrip64 is a 64-byte write and a 64-byte reply, shm vs a
// plain unix socket, each echoed by another goroutine.
func BenchmarkRoundTrip64(b *testing.B) {
	b.Run("shm", func(b *testing.B) {
		g, h := pair(b, Options{})
		benchEcho(b, g, h)
	})
	b.Run("unix", func(b *testing.B) {
		path := filepath.Join(b.TempDir(), "u.sock")
		ul, _ := net.Listen("unix", path)
		defer ul.Close()
		gc, _ := net.Dial("unix", path)
		hc, _ := ul.Accept()
		defer gc.Close()
		defer hc.Close()
		benchEcho(b, gc, hc)
	})
}

func benchEcho(b *testing.B, g, h net.Conn) {
	go func() {
		buf := make([]byte, 64)
		for {
			if _, err := io.ReadFull(h, buf); err != nil {
				return
			}
			if _, err := h.Write(buf); err != nil {
				return
			}
		}
	}()
	msg, buf := make([]byte, 64), make([]byte, 64)
	b.ResetTimer()
	for range b.N {
		g.Write(msg)
		if _, err := io.ReadFull(g, buf); err != nil {
			b.Fatal(err)
		}
	}
}
