package hypervisor

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/handlemap"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/kernels"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// TestFailKeepsTheChain: a refusal matches its own status and the error
// that caused it, and reports its own status even when the cause carries
// another one.
func TestFailKeepsTheChain(t *testing.T) {
	cause := fmt.Errorf("backend: %w", abi.StatusLaunchFailed)
	err := fail(abi.StatusInvalidValue, "checking the launch: %w", cause)
	if !errors.Is(err, abi.StatusInvalidValue) || !errors.Is(err, cause) || !isRefusal(err) {
		t.Errorf("%v: lost its status or its cause", err)
	}
	if st := statusOf(err); st != abi.StatusInvalidValue {
		t.Errorf("status %v, want the refusal's own", st)
	}
	if got, want := err.Error(), "checking the launch: backend: launch failed"; got != want {
		t.Errorf("message %q, want %q", got, want)
	}

	srv, e := NewServer(sim.New(1<<20), DefaultConfig(), prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if e != nil {
		t.Fatal(e)
	}
	sess, e := srv.newSession(1, 0, sessionOpen{Guest: "g"}, DefaultConfig().WindowBase, true)
	if e != nil {
		t.Fatal(e)
	}
	_, err = sess.handle(abi.OpStreamSync, 1, false, (&abi.StreamSync{Stream: 99}).Append(nil))
	if !errors.Is(err, abi.StatusInvalidHandle) || !errors.Is(err, handlemap.ErrUnknown) {
		t.Errorf("unknown stream: %v, want invalid handle wrapping handlemap.ErrUnknown", err)
	}
	_, err = sess.handle(abi.OpAlloc, 2, false, []byte{1})
	if !errors.Is(err, abi.StatusInvalidValue) || !errors.Is(err, abi.ErrTruncated) {
		t.Errorf("truncated request: %v, want invalid value wrapping abi.ErrTruncated", err)
	}
}

// TestGuestKernelsNeedAProcessPerGuest: a kernel that is not the library's
// own is refused, naming the setting, unless the node serves one guest per
// process; that setting with more sessions is refused at start.
func TestGuestKernelsNeedAProcessPerGuest(t *testing.T) {
	cfg := DefaultConfig()
	cfg.GuestKernels = true
	if _, err := NewServer(sim.New(1<<20), cfg, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil))); err == nil {
		t.Fatal("guest kernels with 64 sessions per process accepted")
	}
	srv, err := NewServer(sim.New(1<<20), DefaultConfig(), prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	sess, err := srv.newSession(1, 0, sessionOpen{Guest: "g"}, DefaultConfig().WindowBase, true)
	if err != nil {
		t.Fatal(err)
	}
	img := &abi.ModuleImage{Kernels: []abi.KernelSpec{{Name: "read_other_windows", PTX: ".version 8.0\n.target sm_90\n"}}}
	_, err = sess.handle(abi.OpModuleLoad, 1, false, (&abi.ModuleLoad{Image: img.Append(nil)}).Append(nil))
	if !errors.Is(err, abi.StatusNotSupported) || !strings.Contains(err.Error(), "--guest.kernels") {
		t.Fatalf("a guest-built kernel: %v, want not supported naming --guest.kernels", err)
	}
}

// uncheckedGPU is the software GPU without its access checks' marker: to
// the hypervisor, a GPU that runs kernel code unchecked.
type uncheckedGPU struct{ gpu.Backend }

// TestPointerFollowingKernelNeedsCheckedGPU: on a GPU that does not check
// every access, a library kernel that follows stored pointers is refused
// (naming the setting), while one whose footprint is known runs.
func TestPointerFollowingKernelNeedsCheckedGPU(t *testing.T) {
	srv, err := NewServer(uncheckedGPU{sim.New(1 << 24)}, DefaultConfig(), prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	sess, err := srv.newSession(1, 0, sessionOpen{Guest: "g"}, DefaultConfig().WindowBase, true)
	if err != nil {
		t.Fatal(err)
	}
	id := uint64(0)
	call := func(op abi.Opcode, body abi.Body) (abi.Body, error) {
		id++
		return sess.handle(op, id, false, body.Append(nil))
	}
	reply, err := call(abi.OpAlloc, &abi.Alloc{Size: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	p := reply.(*abi.AllocReply).Ptr
	launch := func(name string, grid uint32, args ...abi.Arg) error {
		img, _ := kernels.Image(name)
		m, err := call(abi.OpModuleLoad, &abi.ModuleLoad{Image: img})
		if err != nil {
			return err
		}
		f, err := call(abi.OpGetFunction, &abi.GetFunction{Module: m.(*abi.HandleReply).Handle, Name: name})
		if err != nil {
			return err
		}
		_, err = call(abi.OpLaunch, &abi.Launch{Function: f.(*abi.HandleReply).Handle, Grid: abi.Dim3{X: grid, Y: 1, Z: 1},
			Block: abi.Dim3{X: 32, Y: 1, Z: 1}, Args: args})
		return err
	}
	ptr := func(v uint64) abi.Arg { return abi.Arg{Kind: abi.ArgPtr, Bits: v} }
	u32 := func(v uint64) abi.Arg { return abi.Arg{Kind: abi.ArgU32, Bits: v} }
	if err := launch("vadd", 1, ptr(p), ptr(p), ptr(p), u32(32)); err != nil {
		t.Fatalf("vadd on an unchecked GPU: %v", err)
	}
	if err := launch("vadd", 1<<11, ptr(p), ptr(p), ptr(p), u32(1<<16)); !errors.Is(err, abi.StatusLaunchFailed) {
		t.Fatalf("vadd reaching past its allocation: %v, want launch failed before it runs", err)
	}
	err = launch("pointer_chase", 1, ptr(p), u32(4), ptr(p+4096))
	if !errors.Is(err, abi.StatusNotSupported) || !strings.Contains(err.Error(), "--guest.kernels") {
		t.Fatalf("pointer_chase on an unchecked GPU: %v, want not supported naming --guest.kernels", err)
	}
}
