package hypervisor_test

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// TestStatusConnection: with --guest.max-sessions 1 taken by a guest that
// holds memory, a status connection of the same tenant is still opened and
// answers device_info and device_status (its tenant's memory, no session
// of its own); it runs nothing else, opens no session, takes no slot, and
// status connections past the node's bound are refused.
func TestStatusConnection(t *testing.T) {
	cfg := hypervisor.DefaultConfig()
	cfg.MaxSessions, cfg.MaxStatusConns = 1, 2
	e := start(t, cfg)
	guest := e.client(t, "program")
	mustAlloc(t, guest, 64<<20, 1)
	if st, _ := dialRaw(t, e).send(abi.OpHello, 0, 1, &abi.Hello{GuestName: "second"}, &abi.HelloReply{}); st != abi.StatusOutOfMemory {
		t.Fatalf("a second session with --guest.max-sessions 1: %s", st)
	}

	watch := dialRaw(t, e)
	var hr abi.StatusHelloReply
	if st, msg := watch.send(abi.OpStatusHello, 0, 1, &abi.StatusHello{GuestName: "nvidia-smi"}, &hr); st != abi.StatusOK || hr.Term != 1 {
		t.Fatalf("status_hello beside the session that holds the only slot: %s %q, term %d", st, msg, hr.Term)
	}
	var info abi.DeviceInfoReply
	if st, msg := watch.send(abi.OpDeviceInfo, 0, 2, &abi.DeviceInfo{}, &info); st != abi.StatusOK || info.Name != "vgpuha software GPU" || info.TotalMem != 1<<30 {
		t.Fatalf("device_info: %s %q %+v", st, msg, info)
	}
	var status abi.DeviceStatusReply
	if st, msg := watch.send(abi.OpDeviceStatus, 0, 3, &abi.DeviceStatus{}, &status); st != abi.StatusOK {
		t.Fatalf("device_status: %s %q", st, msg)
	}
	if used, ok := status.Get(abi.FieldGuestMemoryUsed); !ok || used != 64<<20 {
		t.Errorf("memory its tenant holds: %d (%v), want the session's 64 MiB", used, ok)
	}
	if _, ok := status.Get(abi.FieldSessionMemory); ok {
		t.Error("a status connection was told of a session's memory: it has none")
	}
	for id, r := range []struct {
		op  abi.Opcode
		req abi.Body
	}{
		{abi.OpAlloc, &abi.Alloc{Size: 4096}}, {abi.OpCopyDtoH, &abi.CopyDtoH{Src: 0x7e0000000000, Size: 16}},
		{abi.OpHello, &abi.Hello{GuestName: "x"}}, {abi.OpStatusHello, &abi.StatusHello{GuestName: "x"}},
	} {
		if st, _ := watch.send(r.op, 0, uint64(10+id), r.req, nil); st != abi.StatusInvalidValue {
			t.Errorf("%s on a status connection: %s, want refused", r.op, st)
		}
	}
	if st := e.srv.Status(); len(st.Sessions) != 1 || st.StatusConnections != 1 {
		t.Errorf("node status: %d sessions, %d status connections; want the guest's one and one", len(st.Sessions), st.StatusConnections)
	}
	if st, _ := dialRaw(t, e).send(abi.OpStatusHello, 0, 1, &abi.StatusHello{GuestName: "two"}, &abi.StatusHelloReply{}); st != abi.StatusOK {
		t.Fatalf("a second status connection: %s", st)
	}
	if st, msg := dialRaw(t, e).send(abi.OpStatusHello, 0, 1, &abi.StatusHello{GuestName: "three"}, nil); st != abi.StatusUnavailable ||
		!strings.Contains(msg, "max-status-connections") {
		t.Errorf("a status connection past --guest.max-status-connections 2: %s %q", st, msg)
	}
	if st, _ := dialRaw(t, e).send(abi.OpStatusHello, 0, 1, &abi.StatusHello{GuestName: "bad\x00name"}, nil); st != abi.StatusInvalidValue {
		t.Errorf("an unprintable guest name: %s", st)
	}
	e.srv.SetRole(hypervisor.Role{Term: 2, Fenced: true, Why: "test"})
	if _, err := watch.fr.ReadFrame(); err == nil {
		t.Error("a fenced node kept its status connection")
	}
	probe, host := net.Pipe() // a connection that reaches the fenced node: refused as a session's hello is
	go e.srv.ServeConn(host)
	defer probe.Close()
	late := &raw{t: t, conn: probe, fr: abi.NewFrameReader(probe, 1<<20)}
	if st, _ := late.send(abi.OpStatusHello, 0, 1, &abi.StatusHello{GuestName: "late"}, nil); st != abi.StatusDeposed {
		t.Errorf("status_hello on a fenced node: %s, want deposed", st)
	}
}

// FuzzStatusConn drives a status connection with arbitrary requests: the
// node must never panic, open a session or hold device memory for it, and
// must forget the connection once it ends.
func FuzzStatusConn(f *testing.F) {
	seed := func(op abi.Opcode, body abi.Body) []byte {
		b := body.Append(nil)
		return append([]byte{byte(op), 0, byte(len(b))}, b...)
	}
	f.Add(append(seed(abi.OpDeviceStatus, &abi.DeviceStatus{}), seed(abi.OpDeviceInfo, &abi.DeviceInfo{})...))
	f.Add(append(seed(abi.OpAlloc, &abi.Alloc{Size: 4096}), seed(abi.OpHello, &abi.Hello{GuestName: "g"})...))
	f.Add(append(seed(abi.OpStatusHello, &abi.StatusHello{}), seed(abi.OpBye, &abi.Bye{})...))
	f.Fuzz(func(t *testing.T, data []byte) {
		backend := sim.New(64 << 20)
		reg := prometheus.NewRegistry()
		srv, err := hypervisor.NewServer(backend, hypervisor.DefaultConfig(), reg, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			t.Fatal(err)
		}
		guest, host := net.Pipe()
		done := make(chan struct{})
		go func() { srv.ServeConn(host); close(done) }()
		go io.Copy(io.Discard, guest)
		stream := abi.AppendBodyFrame(nil, abi.OpStatusHello, 0, 1, &abi.StatusHello{GuestName: "fuzz"})
		stream = append(stream, bytes.TrimPrefix(framesFrom(data), hello(1))...)
		guest.Write(stream)
		guest.Close()
		<-done
		if st := srv.Status(); len(st.Sessions) != 0 || st.StatusConnections != 0 || backend.Used() != 0 {
			t.Fatalf("after the guest left: %d sessions, %d status connections, %d device bytes", len(st.Sessions), st.StatusConnections, backend.Used())
		}
		if n := panicCount(t, reg); n != 0 {
			t.Fatalf("%d panics recovered: a handler has a bug", n)
		}
	})
}
