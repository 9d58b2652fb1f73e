package hypervisor

import (
	"errors"
	"io"
	"log/slog"
	"reflect"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/kernels"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

func isGlobalOp(op abi.Opcode) bool {
	return op == abi.OpModuleGlobal || op == abi.OpGlobalWrite || op == abi.OpGlobalRead
}

// The software GPU holds no module variables: every named access is
// refused (not supported), a module the session does not hold is an
// invalid handle, an over-long read is refused before anything is
// allocated, and none of it changes the session.
func TestModuleVariablesRefusedHere(t *testing.T) {
	sess := newSimSession(t)
	module := loadVadd(t, sess, 1)
	for i, tt := range []struct {
		op   abi.Opcode
		req  abi.Body
		want abi.Status
	}{
		{abi.OpModuleGlobal, &abi.ModuleGlobal{Module: module, Name: "counter"}, abi.StatusNotSupported},
		{abi.OpGlobalWrite, &abi.GlobalWrite{Module: module, Name: "counter", Data: []byte{1}}, abi.StatusNotSupported},
		{abi.OpGlobalRead, &abi.GlobalRead{Module: module, Name: "counter", Length: 4}, abi.StatusNotSupported},
		{abi.OpModuleGlobal, &abi.ModuleGlobal{Module: module + 99, Name: "counter"}, abi.StatusInvalidHandle},
		{abi.OpGlobalWrite, &abi.GlobalWrite{Module: module + 99, Name: "counter", Data: []byte{1}}, abi.StatusInvalidHandle},
		{abi.OpGlobalRead, &abi.GlobalRead{Module: module, Name: "counter", Length: abi.MaxGlobalCopy + 1}, abi.StatusInvalidValue},
	} {
		before := checksums([]*Session{sess})
		_, err := sess.handle(tt.op, uint64(i+2), false, tt.req.Append(nil))
		if st := statusOf(err); !errors.Is(err, tt.want) && st != tt.want {
			t.Errorf("%s %+v: %v (status %v), want %v", tt.op, tt.req, err, st, tt.want)
		}
		if !reflect.DeepEqual(checksums([]*Session{sess}), before) {
			t.Errorf("%s: a refused request changed the session", tt.op)
		}
	}
}

// newSimSession is a session of a server on a 1 GiB software GPU.
// loadVadd loads the kernel library's vadd into sess as request id and
// returns the module's handle.
func loadVadd(t *testing.T, sess *Session, id uint64) uint64 {
	t.Helper()
	img, err := kernels.Image("vadd")
	if err != nil {
		t.Fatal(err)
	}
	reply, err := sess.handle(abi.OpModuleLoad, id, false, (&abi.ModuleLoad{Image: img}).Append(nil))
	if err != nil {
		t.Fatal(err)
	}
	return abi.ResultOf(reply)
}

func newSimSession(t *testing.T) *Session {
	t.Helper()
	cfg := DefaultConfig()
	srv, err := NewServer(sim.New(1<<30), cfg, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	sess, err := srv.newSession(1, 0, sessionOpen{Guest: "g"}, cfg.WindowBase, true)
	if err != nil {
		t.Fatal(err)
	}
	return sess
}
