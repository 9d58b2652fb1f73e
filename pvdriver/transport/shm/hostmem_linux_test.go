package shm

import (
	"bytes"
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// listen starts a listener on a fresh socket.
func listen(t *testing.T) (*Listener, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.sock")
	ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln, _ := NewListener(ul, 0)
	t.Cleanup(func() { ln.Close() })
	return ln, path
}

func dialAccept(t *testing.T, ln *Listener, path string, opts Options) (*Conn, *Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	g, err := Dial(ctx, path, opts)
	if err != nil {
		t.Fatal(err)
	}
	h, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	return g, h.(*Conn)
}

// TestHostMemoryShared: the node maps the guest's region; bytes written on
// either side are seen on the other; the same region handed to a second
// connection (a resume) is the same memory; the budget counts a region
// until the node releases it.
func TestHostMemoryShared(t *testing.T) {
	ln, path := listen(t)
	hm, err := NewHostMemory(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer hm.Close()
	g, h := dialAccept(t, ln, path, Options{HostMemory: hm})
	if !g.HostMemoryShared() {
		t.Fatal("the node did not map the region")
	}
	mem, release := h.TakeHostMemory()
	if len(mem) != 1<<20 || ln.HostMemoryInUse() != 1<<20 {
		t.Fatalf("took %d bytes, budget holds %d", len(mem), ln.HostMemoryInUse())
	}
	if again, _ := h.TakeHostMemory(); again != nil {
		t.Fatal("the region was taken twice")
	}
	copy(hm.Bytes()[4096:], "from the guest")
	if !bytes.Equal(mem[4096:4096+14], []byte("from the guest")) {
		t.Fatal("the node does not see the guest's bytes")
	}
	copy(mem[8192:], "from the node")
	if !bytes.Equal(hm.Bytes()[8192:8192+13], []byte("from the node")) {
		t.Fatal("the guest does not see the node's bytes")
	}
	g.Close()
	h.Close() // taken: stays mapped until released
	if mem[4096] != 'f' || ln.HostMemoryInUse() != 1<<20 {
		t.Fatal("Close released a region the node had taken")
	}
	release()
	release() // once only
	if n := ln.HostMemoryInUse(); n != 0 {
		t.Fatalf("released, the budget still holds %d bytes", n)
	}
	g2, h2 := dialAccept(t, ln, path, Options{HostMemory: hm})
	defer g2.Close()
	defer h2.Close()
	mem2, release2 := h2.TakeHostMemory()
	defer release2()
	if !bytes.Equal(mem2[4096:4096+14], []byte("from the guest")) {
		t.Fatal("a second connection with the same region sees other bytes")
	}
}

// TestHostMemoryBudget: a region over the listener's budget is not mapped
// but the connection is served; an untaken region is released by Close.
func TestHostMemoryBudget(t *testing.T) {
	ln, path := listen(t)
	ln.SetHostMemoryBudget(1 << 20)
	big, _ := NewHostMemory(2 << 20)
	small, _ := NewHostMemory(1 << 20)
	defer big.Close()
	defer small.Close()
	g, h := dialAccept(t, ln, path, Options{HostMemory: big})
	if g.HostMemoryShared() || ln.HostMemoryInUse() != 0 {
		t.Fatal("a region over the budget was mapped")
	}
	if mem, _ := h.TakeHostMemory(); mem != nil {
		t.Fatal("a region over the budget was handed to the node")
	}
	g.Close()
	h.Close()
	g, h = dialAccept(t, ln, path, Options{HostMemory: small})
	if !g.HostMemoryShared() || ln.HostMemoryInUse() != 1<<20 {
		t.Fatal("a region within the budget was not mapped")
	}
	h.Close() // never taken: Close releases it
	g.Close()
	if n := ln.HostMemoryInUse(); n != 0 {
		t.Fatalf("after Close the budget holds %d bytes", n)
	}
}

// TestHostMemoryHelloRefusals: a hello that asks for a region it does not
// hand over, or one of another size than its file, is refused.
func TestHostMemoryHelloRefusals(t *testing.T) {
	_, path := listen(t)
	for _, tc := range []struct {
		name     string
		hostSize uint64
		fileSize uint64 // zero: no second file
	}{
		{"no region file", 1 << 20, 0},
		{"region of another size", 1 << 20, 2 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			areaFD, area, err := sealedFile("area", areaSize(MinRing, MinRing))
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(areaFD)
			defer unix.Munmap(area)
			fds := []int{areaFD}
			if tc.fileSize != 0 {
				fd, mem, err := sealedFile("region", tc.fileSize)
				if err != nil {
					t.Fatal(err)
				}
				defer unix.Close(fd)
				defer unix.Munmap(mem)
				fds = append(fds, fd)
			}
			c, err := net.Dial("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			uc := c.(*net.UnixConn)
			uc.WriteMsgUnix(appendHello(nil, MinRing, MinRing, tc.hostSize), unix.UnixRights(fds...), nil)
			if _, err := readVerdict(uc); !errors.Is(err, ErrHandshake) {
				t.Fatalf("got %v, want a refusal", err)
			}
		})
	}
}
