package hypervisor

import (
	"reflect"
	"testing"

	"github.com/vgpuha/vgpuha/hypervisor/guestconn"
	"github.com/vgpuha/vgpuha/kernels"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// TestOpTableCoversABI: every opcode is either served from opTable or
// handled by the connection itself (abi marks those Control), and the
// async and mutating sets agree with what the guest driver pipelines.
func TestOpTableCoversABI(t *testing.T) {
	byConn := map[abi.Opcode]bool{abi.OpHello: true, abi.OpReject: true, abi.OpBye: true, abi.OpStatusHello: true}
	for _, op := range abi.Opcodes() {
		_, inTable := opTable[op]
		if inTable == byConn[op] {
			t.Errorf("%s: in opTable %v, handled by the connection %v; want exactly one", op, inTable, byConn[op])
		}
		if control := op.Info().Control; control != byConn[op] {
			t.Errorf("%s: abi says control %v, the hypervisor handles it by the connection %v", op, control, byConn[op])
		}
	}
	for op := range opTable {
		if info := op.Info(); info.Async && !info.Mutates {
			t.Errorf("%s is async but changes nothing: nothing to pipeline", op)
		}
	}
}

// TestHandlersAgreeWithABI runs every handler on a session and checks that
// what it does is what abi's row says: it changes the session's objects
// exactly when the row says it mutates, its reply body has the row's type
// and a result exactly where the row names one, and a state change resent
// with the same request id gets the same reply, rebuilt from the recorded
// result.
func TestHandlersAgreeWithABI(t *testing.T) {
	sess := newSimSession(t)
	img, err := kernels.Image("vadd")
	if err != nil {
		t.Fatal(err)
	}
	var ptr, module, function, stream, reserved uint64
	one, block := abi.Dim3{X: 1, Y: 1, Z: 1}, abi.Dim3{X: 64, Y: 1, Z: 1}
	steps := []struct {
		op   abi.Opcode
		req  func() abi.Body
		keep *uint64 // where the result goes, for later steps
	}{
		{abi.OpAlloc, func() abi.Body { return &abi.Alloc{Size: 4096} }, &ptr},
		{abi.OpCopyHtoD, func() abi.Body { return &abi.CopyHtoD{Dst: ptr, Data: []byte{1, 2, 3}} }, nil},
		{abi.OpCopyDtoH, func() abi.Body { return &abi.CopyDtoH{Src: ptr, Size: 3} }, nil},
		{abi.OpCopyDtoD, func() abi.Body { return &abi.CopyDtoD{Dst: ptr + 8, Src: ptr, Size: 3} }, nil},
		{abi.OpMemset, func() abi.Body { return &abi.Memset{Dst: ptr, Width: 1, Value: 7, Count: 16} }, nil},
		{abi.OpModuleLoad, func() abi.Body { return &abi.ModuleLoad{Image: img} }, &module},
		{abi.OpGetFunction, func() abi.Body { return &abi.GetFunction{Module: module, Name: "vadd"} }, &function},
		{abi.OpFunctionParams, func() abi.Body { return &abi.FunctionParams{Function: function} }, nil},
		{abi.OpOccupancy, func() abi.Body { return &abi.Occupancy{Function: function, Kind: abi.OccupancyBlocks, Block: block} }, nil},
		{abi.OpStreamCreate, func() abi.Body { return &abi.StreamCreate{} }, &stream},
		{abi.OpLaunch, func() abi.Body {
			return &abi.Launch{Function: function, Grid: one, Block: block, Stream: stream,
				Args: []abi.Arg{abi.Ptr(ptr), abi.Ptr(ptr), abi.Ptr(ptr), abi.U32(64)}}
		}, nil},
		{abi.OpStreamSync, func() abi.Body { return &abi.StreamSync{Stream: stream} }, nil},
		{abi.OpSync, func() abi.Body { return &abi.Sync{} }, nil},
		{abi.OpDeviceInfo, func() abi.Body { return &abi.DeviceInfo{} }, nil},
		{abi.OpDeviceStatus, func() abi.Body { return &abi.DeviceStatus{} }, nil},
		{abi.OpStreamDestroy, func() abi.Body { return &abi.StreamDestroy{Stream: stream} }, nil},
		{abi.OpModuleUnload, func() abi.Body { return &abi.ModuleUnload{Module: module} }, nil},
		{abi.OpModuleLoadCached, func() abi.Body { return &abi.ModuleLoadCached{Hash: abi.HashImage(img)} }, &module},
		{abi.OpImageStage, func() abi.Body {
			return &abi.ImageStage{Hash: abi.HashImage(img), Total: uint64(len(img)), Data: img[:10]}
		}, nil},
		{abi.OpCopyHtoDHost, func() abi.Body { return &abi.HostCopy{Dev: ptr, Offset: 4096, Size: 100} }, nil},
		{abi.OpCopyDtoHHost, func() abi.Body { return &abi.HostCopy{Dev: ptr, Offset: 0, Size: 100} }, nil},
		{abi.OpFree, func() abi.Body { return &abi.Free{Ptr: ptr} }, nil},
		{abi.OpAddressReserve, func() abi.Body { return &abi.AddressReserve{Size: 4 << 20} }, &reserved},
		{abi.OpMemMap, func() abi.Body { return &abi.MemMap{Ptr: reserved, Size: 2 << 20} }, nil},
		{abi.OpMemUnmap, func() abi.Body { return &abi.MemUnmap{Ptr: reserved, Size: 2 << 20} }, nil},
		{abi.OpAddressFree, func() abi.Body { return &abi.AddressFree{Ptr: reserved, Size: 4 << 20} }, nil},
	}
	sess.mem.SetHost(guestconn.NewRegion(make([]byte, 8192))) // as a shared-memory connection's region
	ran := map[abi.Opcode]bool{}
	for i, step := range steps {
		op, info, reqID := step.op, step.op.Info(), uint64(i+1)
		payload := step.req().Append(nil)
		before := checksums([]*Session{sess})
		reply, err := sess.handle(op, reqID, false, payload)
		if err != nil {
			t.Fatalf("%s: %v", op, err)
		}
		ran[op] = true
		if changed := !reflect.DeepEqual(checksums([]*Session{sess}), before); changed != info.Mutates {
			t.Errorf("%s: changed the session's objects %v, abi's row says it mutates %v", op, changed, info.Mutates)
		}
		checkReply(t, op, reply)
		if got, want := abi.ResultOf(reply) != 0, info.Result != abi.NoResult; got != want {
			t.Errorf("%s: reply %#v has a result %v, abi's row says %v", op, reply, got, want)
		}
		if step.keep != nil {
			*step.keep = abi.ResultOf(reply)
		}
		if !info.Mutates {
			continue
		}
		again, err := sess.handle(op, reqID, false, payload)
		if err != nil || !reflect.DeepEqual(again, reply) {
			t.Errorf("%s resent: got %#v, %v; first reply %#v", op, again, err, reply)
		}
	}
	for op := range opTable {
		// Attaching an aperture takes a memory file from the guest process
		// on the other end of a unix socket: TestApertureInOwnProcess
		// drives it through the guest driver, which decodes its reply.
		// Module variables live in modules of the guest's own machine code,
		// which only the CUDA backend loads: TestModuleVariablesRefusedHere
		// checks the software GPU's refusal, hypervisor/cuda the real thing.
		// Tensor maps too: the software GPU encodes none
		// (TestTensorMapRefusedHere).
		if !ran[op] && op != abi.OpApertureAttach && !isGlobalOp(op) && op != abi.OpTensorMapEncode {
			t.Errorf("%s: not exercised; add a step", op)
		}
	}
}

// checkReply checks that a handler's reply body has the type abi's row
// says the guest decodes it as.
func checkReply(t *testing.T, op abi.Opcode, reply abi.Body) {
	t.Helper()
	newReply := op.Info().NewReply
	switch {
	case newReply == nil && reply != nil:
		t.Errorf("%s: replied %T, abi's row says a status only", op, reply)
	case newReply != nil && reflect.TypeOf(reply) != reflect.TypeOf(newReply()):
		t.Errorf("%s: replied %T, abi's row says %T", op, reply, newReply())
	}
}

// TestDeviceStatusOnSim: the software GPU reports the memory its guest
// holds (its tenant's sessions together, and this session's share) and
// nothing else: no temperature or clock it does not have.
func TestDeviceStatusOnSim(t *testing.T) {
	sess := newSimSession(t)
	status := func() *abi.DeviceStatusReply {
		t.Helper()
		reply, err := sess.handle(abi.OpDeviceStatus, 0, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		return reply.(*abi.DeviceStatusReply)
	}
	if v, ok := status().Get(abi.FieldSessionMemory); !ok || v != 0 {
		t.Fatalf("a new session holds %d (%v), want 0", v, ok)
	}
	if _, err := sess.handle(abi.OpAlloc, 1, false, (&abi.Alloc{Size: 1 << 20}).Append(nil)); err != nil {
		t.Fatal(err)
	}
	r := status()
	if v, ok := r.Get(abi.FieldSessionMemory); !ok || v != sess.mem.Bytes() || v < 1<<20 {
		t.Errorf("session memory %d (%v), the session holds %d", v, ok, sess.mem.Bytes())
	}
	if v, ok := r.Get(abi.FieldGuestMemoryUsed); !ok || v < sess.mem.Bytes() {
		t.Errorf("guest memory %d (%v), below the session's %d", v, ok, sess.mem.Bytes())
	}
	for _, f := range []abi.DeviceField{abi.FieldTemperature, abi.FieldPowerUsage, abi.FieldUtilGPU, abi.FieldClockSM, abi.FieldPCIDeviceID} {
		if v, ok := r.Get(f); ok {
			t.Errorf("field %d reads %d on the software GPU, which has no such sensor", f, v)
		}
	}
}
