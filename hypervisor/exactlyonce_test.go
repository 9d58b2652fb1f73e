package hypervisor_test

import (
	"bytes"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// raw is a guest speaking frames by hand, one request at a time.
type raw struct {
	t    *testing.T
	conn net.Conn
	fr   *abi.FrameReader
}

func dialRaw(t *testing.T, e *env) *raw {
	t.Helper()
	return dialRawAt(t, e.endpoint)
}

// dialRawAt is dialRaw to a unix:// endpoint.
func dialRawAt(t *testing.T, endpoint string) *raw {
	t.Helper()
	conn, err := net.Dial("unix", strings.TrimPrefix(endpoint, "unix://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &raw{t: t, conn: conn, fr: abi.NewFrameReader(conn, 1<<20)}
}

// send writes one request; unless it is async it returns the reply's
// status, message and body (decoded into body when given).
func (r *raw) send(op abi.Opcode, flags uint16, id uint64, req, body abi.Body) (abi.Status, string) {
	r.t.Helper()
	if _, err := r.conn.Write(abi.AppendBodyFrame(nil, op, flags, id, req)); err != nil {
		r.t.Fatal(err)
	}
	if flags&abi.FlagAsync != 0 {
		return abi.StatusOK, ""
	}
	r.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	f, err := r.fr.ReadFrame()
	if err != nil {
		r.t.Fatalf("%s %d: %v", op, id, err)
	}
	if f.RequestID != id {
		r.t.Fatalf("%s: reply to id %d, want %d", op, f.RequestID, id)
	}
	st, msg, err := abi.DecodeReply(f.Payload, body)
	if err != nil {
		r.t.Fatal(err)
	}
	return st, msg
}

func refusals(t *testing.T, e *env, reason string) float64 {
	t.Helper()
	return counter(t, e, "vgpuha_guest_refusals_total", map[string]string{"reason": reason})
}

func counter(t *testing.T, e *env, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// TestRequestIDs: an id of 2^64−1 is refused instead of making every later
// id look like a resend; a resend under an applied id is answered from
// state, but one with other content is refused and counted.
func TestRequestIDs(t *testing.T) {
	e := start(t, hypervisor.DefaultConfig())
	r := dialRaw(t, e)
	if st, msg := r.send(abi.OpHello, 0, 1, &abi.Hello{GuestName: "ids"}, &abi.HelloReply{}); st != abi.StatusOK {
		t.Fatal(msg)
	}
	if st, _ := r.send(abi.OpAlloc, 0, ^uint64(0), &abi.Alloc{Size: 4096}, nil); st != abi.StatusInvalidValue {
		t.Fatalf("alloc with id 2^64-1: %v", st)
	}
	var a, again abi.AllocReply
	if st, msg := r.send(abi.OpAlloc, 0, 2, &abi.Alloc{Size: 4096}, &a); st != abi.StatusOK || a.Ptr == 0 {
		t.Fatalf("alloc with id 2 after the refused one: %v %s", st, msg)
	}
	if st, _ := r.send(abi.OpAlloc, 0, 2, &abi.Alloc{Size: 4096}, &again); st != abi.StatusOK || again.Ptr != a.Ptr {
		t.Fatalf("resent alloc: %v %#x, want the first reply %#x", st, again.Ptr, a.Ptr)
	}
	if st, _ := r.send(abi.OpAlloc, 0, 2, &abi.Alloc{Size: 8192}, nil); st != abi.StatusInvalidValue {
		t.Fatalf("alloc with a reused id and other content: %v", st)
	}
	if got := e.srv.Status().Sessions[0].Allocations; got != 1 {
		t.Fatalf("%d allocations, want 1", got)
	}
	if refusals(t, e, "request_id") != 1 || refusals(t, e, "replay_mismatch") != 1 {
		t.Fatal("refusals not counted")
	}
}

// TestLargeWriteResends: a large copy_htod's content sum is the one its
// frame reader computed on the way in (abi.Frame.PayloadSum); a resend
// with the same bytes is answered from state, one with a byte changed is
// refused as other content.
func TestLargeWriteResends(t *testing.T) {
	e := start(t, hypervisor.DefaultConfig())
	r := dialRaw(t, e)
	if st, msg := r.send(abi.OpHello, 0, 1, &abi.Hello{GuestName: "ids"}, &abi.HelloReply{}); st != abi.StatusOK {
		t.Fatal(msg)
	}
	var a abi.AllocReply
	if st, msg := r.send(abi.OpAlloc, 0, 2, &abi.Alloc{Size: 1 << 20}, &a); st != abi.StatusOK {
		t.Fatal(msg)
	}
	data := bytes.Repeat([]byte{7}, 256<<10)
	for _, tc := range []struct {
		what string
		data []byte
		want abi.Status
	}{{"the write", data, abi.StatusOK}, {"its resend", data, abi.StatusOK}, {"a resend with other content", append(bytes.Clone(data[:len(data)-1]), 8), abi.StatusInvalidValue}} {
		if st, msg := r.send(abi.OpCopyHtoD, 0, 3, &abi.CopyHtoD{Dst: a.Ptr, Data: tc.data}, nil); st != tc.want {
			t.Fatalf("%s: %v %s, want %v", tc.what, st, msg, tc.want)
		}
	}
	if refusals(t, e, "replay_mismatch") != 1 {
		t.Fatal("the resend with other content was not counted")
	}
}

// TestUnknownRequestIDRefused: an id at or below the last applied one
// that the session never applied is refused with a clear error, not
// answered "done" (an allocation answered with pointer 0 that allocated
// nothing); a resend of one it applied is still answered from state.
func TestUnknownRequestIDRefused(t *testing.T) {
	e := start(t, hypervisor.DefaultConfig())
	r := dialRaw(t, e)
	if st, msg := r.send(abi.OpHello, 0, 1, &abi.Hello{GuestName: "ids"}, &abi.HelloReply{}); st != abi.StatusOK {
		t.Fatal(msg)
	}
	var a, again abi.AllocReply
	if st, msg := r.send(abi.OpAlloc, 0, 10, &abi.Alloc{Size: 4096}, &a); st != abi.StatusOK || a.Ptr == 0 {
		t.Fatalf("alloc with id 10: %v %s", st, msg)
	}
	var never abi.AllocReply
	st, msg := r.send(abi.OpAlloc, 0, 5, &abi.Alloc{Size: 4096}, &never)
	if st != abi.StatusInvalidValue || !strings.Contains(msg, "request id 5 was never applied") {
		t.Fatalf("alloc under an id never used, below the last applied: %v %q (pointer %#x)", st, msg, never.Ptr)
	}
	if st, _ := r.send(abi.OpAlloc, 0, 10, &abi.Alloc{Size: 4096}, &again); st != abi.StatusOK || again.Ptr != a.Ptr {
		t.Fatalf("resent alloc: %v %#x, want the first reply %#x", st, again.Ptr, a.Ptr)
	}
	if got := e.srv.Status().Sessions[0].Allocations; got != 1 {
		t.Fatalf("%d allocations, want 1", got)
	}
	if refusals(t, e, "unknown_request") != 1 {
		t.Fatal("refusal not counted")
	}
}

// TestAsyncRefusalCounted: an async request that fails is counted under its
// own op and status (not "ok"); the guest learns of it at its next sync.
func TestAsyncRefusalCounted(t *testing.T) {
	e := start(t, hypervisor.DefaultConfig())
	r := dialRaw(t, e)
	r.send(abi.OpHello, 0, 1, &abi.Hello{GuestName: "async"}, &abi.HelloReply{})
	bad := &abi.Launch{Function: 99, Grid: abi.Dim3{X: 1, Y: 1, Z: 1}, Block: abi.Dim3{X: 1, Y: 1, Z: 1}}
	r.send(abi.OpLaunch, abi.FlagAsync, 2, bad, nil)
	if st, _ := r.send(abi.OpSync, 0, 3, &abi.Sync{}, nil); st != abi.StatusInvalidHandle {
		t.Fatalf("sync after a bad async launch: %v", st)
	}
	if n := counter(t, e, "vgpuha_guest_requests_total", map[string]string{"op": "launch", "status": "invalid handle"}); n != 1 {
		t.Fatalf("launch counted %v times as invalid handle", n)
	}
	if n, _ := testutil.GatherAndCount(e.reg, "vgpuha_guest_requests_total"); n != 3 { // hello ok, launch refused, sync refused
		t.Fatalf("%d request series, want 3", n)
	}
}

// TestFailedRequestAnswered: a state-changing request that a check
// refused is answered, not forgotten (issue 47): a resend of it under its
// id gets the same failure instead of a second run (deferred again if it
// is pipelined, so the guest's connection goes on), a resend with other
// content is refused, and the next synchronization reports the failure
// once.
func TestFailedRequestAnswered(t *testing.T) {
	e := start(t, hypervisor.DefaultConfig())
	r := dialRaw(t, e)
	r.send(abi.OpHello, 0, 1, &abi.Hello{GuestName: "failed"}, &abi.HelloReply{})
	var a abi.AllocReply
	if st, msg := r.send(abi.OpAlloc, 0, 2, &abi.Alloc{Size: 4096}, &a); st != abi.StatusOK {
		t.Fatal(msg)
	}
	outside := &abi.Memset{Dst: a.Ptr + 4096, Width: 1, Value: 1, Count: 16}
	r.send(abi.OpMemset, abi.FlagAsync, 3, outside, nil)
	r.send(abi.OpMemset, abi.FlagAsync, 3, outside, nil) // a resend, as after a failover
	if st, _ := r.send(abi.OpSync, 0, 4, &abi.Sync{}, nil); st != abi.StatusOutOfRange {
		t.Fatalf("sync after a refused async memset and its resend: %v", st)
	}
	if st, msg := r.send(abi.OpSync, 0, 5, &abi.Sync{}, nil); st != abi.StatusOK {
		t.Fatalf("a second sync: %v %s (the failure is reported once)", st, msg)
	}
	st, msg := r.send(abi.OpMemset, 0, 3, outside, nil)
	if st != abi.StatusOutOfRange || !strings.Contains(msg, "failed when first sent") {
		t.Fatalf("a synchronous resend of the refused memset: %v %q, want its failure again", st, msg)
	}
	inside := &abi.Memset{Dst: a.Ptr, Width: 1, Value: 1, Count: 16}
	if st, _ := r.send(abi.OpMemset, 0, 3, inside, nil); st != abi.StatusInvalidValue {
		t.Fatalf("the refused memset's id resent with other content: %v, want it refused", st)
	}
	if refusals(t, e, "replay_mismatch") != 1 {
		t.Fatal("the resend with other content was not counted")
	}
}
