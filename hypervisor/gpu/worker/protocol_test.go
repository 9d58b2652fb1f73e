package worker

import (
	"bufio"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// fakeChild answers each request read on conn with the next of replies
// in a frame, then closes; raw, it sends data as it is and closes (a
// frame cut short would otherwise leave both ends waiting).
func fakeChild(conn net.Conn, data []byte, raw bool) {
	defer conn.Close()
	if raw {
		conn.Write(data)
		return
	}
	r := bufio.NewReader(conn)
	for _, rep := range splitReplies(data) {
		if _, err := readFrame(r, nil, maxRequest); err != nil {
			return
		}
		if _, err := conn.Write(sealFrame(append(appendFrame(nil), rep...))); err != nil {
			return
		}
	}
}

// splitReplies cuts data into replies, each led by a one-byte length.
func splitReplies(data []byte) [][]byte {
	var out [][]byte
	for len(data) > 0 {
		n := min(int(data[0]), len(data)-1)
		out, data = append(out, data[1:1+n]), data[1+n:]
	}
	return out
}

// everyCall makes every call a context has, the optional ones included.
func everyCall(c *proxy) []error {
	buf := make([]byte, 100_000)
	var errs []error
	add := func(err error) { errs = append(errs, err) }
	add(c.Alloc(1<<40, 4096))
	add(c.CopyHtoD(1<<40, buf[:100], 0))
	add(c.CopyHtoD(1<<40, buf, 0))
	add(c.CopyDtoH(buf[:16], 1<<40, 1))
	add(c.CopyDtoH(buf, 1<<40, 1))
	add(c.CopyDtoD(1, 2, 3, 0))
	add(c.Memset(1, 4, 5, 6, 0))
	m, err := c.LoadModule(&abi.ModuleImage{Kernels: []abi.KernelSpec{{Name: "vadd"}}})
	add(err)
	f, err := c.Function(m, "vadd")
	add(err)
	add(c.Launch(f, gpu.LaunchConfig{}, []abi.Arg{abi.U32(1), abi.Bytes([]byte{1, 2})}, 0))
	s, err := c.CreateStream()
	add(err)
	add(c.SyncStream(s))
	_, err = c.ParamSlots(f)
	add(err)
	_, err = c.FunctionAttrs(f)
	add(err)
	_, _, err = c.Global(m, "g")
	add(err)
	add(c.WriteGlobal(1, buf[:20]))
	add(c.ReadGlobal(buf[:20], 1))
	_, err = c.EncodeTensorMapTiled(&abi.TensorMapEncode{})
	add(err)
	_, err = c.Checksum(1, 2)
	add(err)
	_, err = c.Occupancy(f, &abi.Occupancy{Block: abi.Dim3{X: 32, Y: 1, Z: 1}})
	add(err)
	add(c.DestroyStream(s))
	add(c.UnloadModule(m))
	add(c.Free(1 << 40))
	add(c.Sync())
	add(c.Close())
	return errs
}

// FuzzChildReply: no reply a worker can send, however malformed, crashes
// the node: each call fails or succeeds, and a reply that breaks the
// protocol ends the context with a launch failure.
func FuzzChildReply(f *testing.F) {
	ok := appendReply(nil, nil, abi.StatusOK)
	f.Add(append([]byte{0, byte(len(ok))}, ok...))
	handle := appendU64s(append([]byte(nil), ok...), 5)
	f.Add(append([]byte{1, byte(len(handle))}, handle...))
	failed := appendReply(nil, errors.New("boom"), abi.StatusLaunchFailed)
	f.Add(append([]byte{0, byte(len(failed))}, failed...))
	inline := appendBytes(append([]byte(nil), ok...), make([]byte, 16))
	f.Add(append([]byte{0, byte(len(ok)), byte(len(ok)), byte(len(ok)), byte(len(inline))}, append(append(append(ok, ok...), ok...), inline...)...))
	f.Add([]byte{2, 4, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0, 6, 99, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		mode, data := data[0], data[1:]
		parent, child := socketpair(t)
		go fakeChild(child, data, mode&2 != 0)
		p := &proxy{link: link{w: parent, r: bufio.NewReader(parent), shm: make([]byte, 64<<10)}, async: mode&1 != 0}
		for _, err := range everyCall(p) {
			var ce *childError
			if err != nil && !errors.As(err, &ce) && !errors.Is(err, abi.StatusLaunchFailed) && !errors.Is(err, abi.StatusInvalidHandle) && !errors.Is(err, abi.StatusInvalidValue) {
				t.Fatalf("a call failed with %v: neither the worker's error nor the context's loss", err)
			}
		}
		parent.Close()
	})
}

// socketpair is a connected pair of unix stream sockets (buffered, as a
// worker's are: net.Pipe's writes wait for the reader).
func socketpair(t testing.TB) (net.Conn, net.Conn) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		if conns[i], err = net.FileConn(f); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	return conns[0], conns[1]
}

// TestReadFrameBounds: a frame longer than the limit is refused before it
// is read, a short one is an unexpected end.
func TestReadFrameBounds(t *testing.T) {
	parent, child := net.Pipe()
	go func(child net.Conn) {
		var hdr [4]byte
		binary.LittleEndian.PutUint32(hdr[:], maxReply+1)
		child.Write(hdr[:])
		child.Close()
	}(child)
	if _, err := readFrame(bufio.NewReader(parent), nil, maxReply); !errors.Is(err, errProtocol) {
		t.Fatalf("an over-long frame: %v, want a protocol error", err)
	}
	parent, child = net.Pipe()
	go func(child net.Conn) {
		child.Write([]byte{8, 0, 0, 0, 1, 2})
		child.Close()
	}(child)
	if _, err := readFrame(bufio.NewReader(parent), nil, maxReply); err == nil {
		t.Fatal("a short frame was read")
	}
}

// FuzzChildRequest: no request stream crashes a worker: serve answers or
// stops with an error.
func FuzzChildRequest(f *testing.F) {
	req := func(o op, flags uint8, body []byte) []byte {
		return sealFrame(append(append(appendFrame(nil), byte(o), flags), body...))
	}
	var seed []byte
	seed = append(seed, req(opDescribe, 0, nil)...)
	seed = append(seed, req(opNewContext, 0, appendU64s(nil, 1<<40, 1<<30))...)
	seed = append(seed, req(opAlloc, 0, appendU64s(nil, 1<<40, 4096))...)
	seed = append(seed, req(opCopyHtoD, 0, appendBytes(appendU64s(nil, 1<<40, 0), []byte{1, 2, 3}))...)
	seed = append(seed, req(opCopyHtoD, flagShm, appendU64s(nil, 1<<40, 0, 4096))...)
	seed = append(seed, req(opCopyDtoH, 0, appendU64s(nil, 1<<40, 16, 0))...)
	seed = append(seed, req(opCopyDtoH, 0, appendU64s(nil, 1<<40, 1<<20, 0))...)
	seed = append(seed, req(opMemset, 0, (&abi.Memset{Dst: 1 << 40, Width: 4, Count: 3}).Append(nil))...)
	seed = append(seed, req(opLaunch, flagAsync, (&abi.Launch{Function: 9}).Append(nil))...)
	seed = append(seed, req(opSync, 0, nil)...)
	seed = append(seed, req(opChecksum, 0, appendU64s(nil, 1<<40, 4096))...)
	seed = append(seed, req(opClose, 0, nil)...)
	f.Add(seed)
	f.Add(req(opCount, 0, nil))
	f.Fuzz(func(t *testing.T, data []byte) {
		parent, child := socketpair(t)
		go func() {
			parent.Write(data)
			parent.(*net.UnixConn).CloseWrite()
			for buf := make([]byte, 64<<10); ; { // drain the replies
				if _, err := parent.Read(buf); err != nil {
					return
				}
			}
		}()
		ctx, _ := serve(child, sim.New(1<<24), make([]byte, 64<<10))
		if ctx != nil {
			ctx.Close()
		}
		child.Close()
		parent.Close()
	})
}
