package transport

import (
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	good := map[string]Endpoint{
		"unix:///run/v.sock":                              {Scheme: "unix", Address: "/run/v.sock"},
		"unix://rel/v.sock":                               {Scheme: "unix", Address: "rel/v.sock"},
		"shm+unix:///run/v.sock":                          {Scheme: "shm+unix", Address: "/run/v.sock"},
		"shm+unix:///run/v.sock?spin=1ms":                 {Scheme: "shm+unix", Address: "/run/v.sock", Spin: time.Millisecond},
		"shm+unix:///run/v.sock?hostmem=0":                {Scheme: "shm+unix", Address: "/run/v.sock", HostMemory: -1},
		"shm+unix:///run/v.sock?hostmem=1048576&spin=1ms": {Scheme: "shm+unix", Address: "/run/v.sock", HostMemory: 1 << 20, Spin: time.Millisecond},
		"tcp://127.0.0.1:7070":                            {Scheme: "tcp", Address: "127.0.0.1:7070"},
		"tcp://[::1]:1":                                   {Scheme: "tcp", Address: "[::1]:1"},
		"vsock://2:7070":                                  {Scheme: "vsock", CID: 2, Port: 7070},
		"vsock://any:7070":                                {Scheme: "vsock", Port: 7070, AnyCID: true},
	}
	for s, want := range good {
		got, err := Parse(s)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", s, got, err, want)
		}
		if s != "unix://rel/v.sock" && got.String() != s {
			t.Errorf("String() = %q, want %q", got.String(), s)
		}
	}
	for _, s := range []string{"", "unix://", "shm+unix://", "tcp://nohost", "tcp://h:1/x", "vsock://x:1", "vsock://1:x", "vsock://1:99999999999", "http://h:1", "::", "shm+unix:///v?spin=20s", "shm+unix:///v?spin=x",
		"shm+unix:///v?hostmem=x", "shm+unix:///v?hostmem=-1", "shm+unix:///v?hostmem=99999999999GiB"} {
		if _, err := Parse(s); !errors.Is(err, ErrEndpoint) {
			t.Errorf("Parse(%q): got %v, want ErrEndpoint", s, err)
		}
	}
}

func TestParseHostMemorySizes(t *testing.T) {
	for s, want := range map[string]int64{"4096": 4096, "64KiB": 64 << 10, "256MiB": 256 << 20, "2GiB": 2 << 30, "0": -1} {
		e, err := Parse("shm+unix:///v?hostmem=" + s)
		if err != nil || e.HostMemory != want {
			t.Errorf("hostmem=%s: %d, %v; want %d", s, e.HostMemory, err, want)
		}
	}
}

func TestListenUnixReplacesStaleSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	ln, err := Listen("unix://" + path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Listen("unix://" + path); err == nil {
		t.Fatal("second listener on a live socket succeeded")
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close() // leaves a stale socket file behind, as a crashed process would
	ln, err = Listen("unix://" + path)
	if err != nil {
		t.Fatalf("listening over a stale socket: %v", err)
	}
	ln.Close()
}

// TestShmListenerServesBoth: a shm+unix listener takes shared-memory and
// plain unix guests on the same socket.
func TestShmListenerServesBoth(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("shared memory needs Linux")
	}
	path := filepath.Join(t.TempDir(), "s.sock")
	ln, err := Listen("shm+unix://" + path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, ep := range []string{"shm+unix://" + path, "unix://" + path} {
		go func() {
			c, err := ln.Accept()
			if err == nil {
				io.Copy(c, c)
				c.Close()
			}
		}()
		c, err := Dial(context.Background(), ep)
		if err != nil {
			t.Fatalf("%s: %v", ep, err)
		}
		c.Write([]byte("ping"))
		b := make([]byte, 4)
		if _, err := io.ReadFull(c, b); err != nil || string(b) != "ping" {
			t.Fatalf("%s: echo %q, %v", ep, b, err)
		}
		c.Close()
	}
}
