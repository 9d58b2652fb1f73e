package hypervisor

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"math"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/hypervisor/guestconn"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// regionSession is a session on the software GPU whose connection maps a
// host-memory region of regionBytes, with one 64 KiB allocation at ptr.
func regionSession(t testing.TB) (sess *Session, ptr uint64) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.MemoryQuota = 16 << 20
	srv, err := NewServer(sim.New(64<<20), cfg, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	sess, err = srv.newSession(1, 0, sessionOpen{Guest: "g"}, cfg.WindowBase, true)
	if err != nil {
		t.Fatal(err)
	}
	reply, err := sess.handle(abi.OpAlloc, 1, false, (&abi.Alloc{Size: 64 << 10}).Append(nil))
	if err != nil {
		t.Fatal(err)
	}
	sess.mem.SetHost(guestconn.NewRegion(make([]byte, regionBytes)))
	return sess, abi.ResultOf(reply)
}

const regionBytes = 64 << 10

// TestHostCopyChecks: a host copy outside the region the node mapped, or
// larger than a frame, or on a connection without a region, fails that
// request only; the session goes on serving host copies.
func TestHostCopyChecks(t *testing.T) {
	sess, ptr := regionSession(t)
	for i := range sess.mem.Host().Bytes() {
		sess.mem.Host().Bytes()[i] = byte(i * 13)
	}
	bad := []struct {
		name string
		req  abi.HostCopy
		want abi.Status
	}{
		{"offset past the end", abi.HostCopy{Dev: ptr, Offset: regionBytes + 1, Size: 1}, abi.StatusOutOfRange},
		{"end past the end", abi.HostCopy{Dev: ptr, Offset: regionBytes - 8, Size: 16}, abi.StatusOutOfRange},
		{"offset that wraps", abi.HostCopy{Dev: ptr, Offset: math.MaxUint64, Size: 2}, abi.StatusOutOfRange},
		{"size that wraps", abi.HostCopy{Dev: ptr, Offset: 8, Size: math.MaxUint64 - 4}, abi.StatusInvalidValue},
		{"over the frame limit", abi.HostCopy{Dev: ptr, Offset: 0, Size: uint64(DefaultConfig().MaxPayload)}, abi.StatusInvalidValue},
		{"device range not allocated", abi.HostCopy{Dev: ptr + 60<<10, Offset: 0, Size: 8 << 10}, abi.StatusOutOfRange},
		{"unknown stream", abi.HostCopy{Dev: ptr, Offset: 0, Size: 8, Stream: 99}, abi.StatusInvalidHandle},
	}
	id := uint64(10)
	for _, op := range []abi.Opcode{abi.OpCopyHtoDHost, abi.OpCopyDtoHHost} {
		for _, tc := range bad {
			id++
			_, err := sess.handle(op, id, false, tc.req.Append(nil))
			if !errors.Is(err, tc.want) {
				t.Errorf("%s, %s: got %v, want %v", op, tc.name, err, tc.want)
			}
		}
	}
	if _, err := sess.handle(abi.OpCopyHtoDHost, 100, true, (&abi.HostCopy{Dev: ptr, Size: 8}).Append(nil)); err == nil {
		t.Error("a pipelined host copy was accepted")
	}
	// The session is fine: a copy in, a copy out through the region.
	if _, err := sess.handle(abi.OpCopyHtoDHost, 101, false, (&abi.HostCopy{Dev: ptr, Offset: 4096, Size: 16 << 10}).Append(nil)); err != nil {
		t.Fatal(err)
	}
	want := bytes.Clone(sess.mem.Host().Bytes()[4096 : 4096+16<<10])
	if _, err := sess.handle(abi.OpCopyDtoHHost, 102, false, (&abi.HostCopy{Dev: ptr, Offset: 40 << 10, Size: 16 << 10}).Append(nil)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(sess.mem.Host().Bytes()[40<<10:56<<10], want) {
		t.Fatal("the copy out of the device does not hold what the copy in wrote")
	}
	// Without a region: StatusNotSupported, which makes the guest send it inline.
	sess.mem.SetHost(nil)
	if _, err := sess.handle(abi.OpCopyHtoDHost, 103, false, (&abi.HostCopy{Dev: ptr, Size: 8}).Append(nil)); !errors.Is(err, abi.StatusNotSupported) {
		t.Fatalf("without a region: %v", err)
	}
}

// FuzzHostCopy sends arbitrary host-copy bodies to a session whose
// connection maps a region: never a panic, and a copy that succeeds lies
// inside the region.
func FuzzHostCopy(f *testing.F) {
	f.Add(true, (&abi.HostCopy{Dev: 0x7e0000000000, Offset: 4096, Size: 100}).Append(nil))
	f.Add(false, (&abi.HostCopy{Dev: 0x7e0000000000, Offset: regionBytes - 1, Size: 1}).Append(nil))
	f.Add(true, (&abi.HostCopy{Dev: 0x7e0000000000, Offset: math.MaxUint64, Size: math.MaxUint64}).Append(nil))
	f.Add(false, []byte{1, 2, 3})
	sess, _ := regionSession(f)
	id := uint64(10)
	f.Fuzz(func(t *testing.T, in bool, body []byte) {
		op := abi.OpCopyDtoHHost
		if in {
			op = abi.OpCopyHtoDHost
		}
		id++
		_, err := sess.handle(op, id, false, body)
		if err != nil {
			return
		}
		var r abi.HostCopy
		if abi.Unmarshal(body, &r) != nil || r.Offset > regionBytes || r.Size > regionBytes-r.Offset {
			t.Fatalf("%s %x succeeded outside the region", op, body)
		}
	})
}
