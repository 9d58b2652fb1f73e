package abi

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// sampleRequests has one filled-in request of every opcode.
func sampleRequests() map[Opcode]Body {
	return map[Opcode]Body{
		OpHello:            &Hello{GuestName: "g1", Resume: 7, GraceMS: 30000},
		OpAlloc:            &Alloc{Size: 4096},
		OpFree:             &Free{Ptr: 0x7e0000000000},
		OpCopyHtoD:         &CopyHtoD{Dst: 0x10, Stream: 2, Data: []byte{1, 2, 3}},
		OpCopyDtoH:         &CopyDtoH{Src: 0x20, Size: 99, Stream: 1},
		OpCopyDtoD:         &CopyDtoD{Dst: 1, Src: 2, Size: 3, Stream: 4},
		OpMemset:           &Memset{Dst: 5, Width: 4, Value: 0xdeadbeef, Count: 10, Stream: 3},
		OpModuleLoad:       &ModuleLoad{Image: []byte("img")},
		OpModuleUnload:     &ModuleUnload{Module: 3},
		OpGetFunction:      &GetFunction{Module: 3, Name: "vadd"},
		OpLaunch:           &Launch{Function: 4, Grid: Dim3{2, 3, 4}, Block: Dim3{32, 1, 1}, SharedBytes: 128, Stream: 1, Args: []Arg{Ptr(0x1000), U32(7), U64(8), F32(1.5), F64(2.5), Bytes([]byte{9, 9})}},
		OpStreamCreate:     &StreamCreate{},
		OpStreamDestroy:    &StreamDestroy{Stream: 2},
		OpStreamSync:       &StreamSync{Stream: 2},
		OpSync:             &Sync{},
		OpReject:           &Reject{},
		OpBye:              &Bye{},
		OpApertureAttach:   &ApertureAttach{Ptr: 0x7e0000001000, Kind: ApertureRegister, FD: 7},
		OpDeviceInfo:       &DeviceInfo{},
		OpFunctionParams:   &FunctionParams{Function: 9},
		OpCopyHtoDHost:     &HostCopy{Dev: 0x7e0000000000, Offset: 4096, Size: 1 << 20, Stream: 2},
		OpCopyDtoHHost:     &HostCopy{Dev: 0x7e0000001000, Offset: 0, Size: 99, Stream: 1},
		OpModuleGlobal:     &ModuleGlobal{Module: 3, Name: "_ZN6cublas9constantsE"},
		OpGlobalWrite:      &GlobalWrite{Module: 3, Name: "step", Offset: 4, Data: []byte{1, 2, 3, 4}},
		OpGlobalRead:       &GlobalRead{Module: 3, Name: "counter", Offset: 0, Length: 4},
		OpModuleLoadCached: &ModuleLoadCached{Hash: HashImage([]byte("image"))},
		OpImageStage:       &ImageStage{Hash: HashImage([]byte("image")), Total: 5, Offset: 2, Data: []byte("age")},
		OpAddressReserve:   &AddressReserve{Size: 64 << 20, Align: 2 << 20, Hint: 0x7e0040000000},
		OpAddressFree:      &AddressFree{Ptr: 0x7e0040000000, Size: 64 << 20},
		OpMemMap:           &MemMap{Ptr: 0x7e0040000000, Size: 2 << 20},
		OpMemUnmap:         &MemUnmap{Ptr: 0x7e0040000000, Size: 2 << 20},
		OpOccupancy: &Occupancy{Function: 9, Kind: OccupancyClusters, Flags: 1, Block: Dim3{128, 1, 1}, Grid: Dim3{64, 1, 1},
			Cluster: Dim3{2, 1, 1}, SharedBytes: 4096, MaxDynamicShared: 100 << 10, NonPortable: true},
		OpTensorMapEncode: &TensorMapEncode{DataType: 9, Rank: 2, Global: 0x7e0000000000, Dims: [MaxTensorRank]uint64{1024, 512},
			Strides: [MaxTensorRank - 1]uint64{2048}, Box: [MaxTensorRank]uint32{64, 64}, ElementStrides: [MaxTensorRank]uint32{1, 1}, Swizzle: 3, L2Promotion: 2},
		OpDeviceStatus: &DeviceStatus{},
		OpStatusHello:  &StatusHello{GuestName: "libnvidia-ml:nvidia-smi", GPU: "GPU-5e1f"},
	}
}

func TestRequestsRoundTrip(t *testing.T) {
	samples := sampleRequests()
	for _, op := range Opcodes() {
		req, ok := samples[op]
		if !ok {
			t.Fatalf("no sample request for %s: add one when adding an opcode", op)
		}
		got, err := DecodeRequest(op, req.Append(nil))
		if err != nil {
			t.Fatalf("%s: %v", op, err)
		}
		if diff := cmp.Diff(req, got); diff != "" {
			t.Errorf("%s round trip (-want +got):\n%s", op, diff)
		}
	}
}

func TestDecodeRefusesShortAndLongBodies(t *testing.T) {
	for op, req := range sampleRequests() {
		b := req.Append(nil)
		if len(b) > 0 {
			if _, err := DecodeRequest(op, b[:len(b)-1]); !errors.Is(err, ErrTruncated) {
				t.Errorf("%s: truncated body gave %v, want ErrTruncated", op, err)
			}
		}
		if _, err := DecodeRequest(op, append(b, 0)); !errors.Is(err, ErrTrailing) {
			t.Errorf("%s: trailing byte gave %v, want ErrTrailing", op, err)
		}
	}
}

func TestLaunchLimits(t *testing.T) {
	l := &Launch{Grid: Dim3{1, 1, 1}, Block: Dim3{1, 1, 1}}
	for range MaxArgs + 1 {
		l.Args = append(l.Args, U32(1))
	}
	if _, err := DecodeRequest(OpLaunch, l.Append(nil)); !errors.Is(err, ErrBadArgument) {
		t.Errorf("%d args: got %v, want ErrBadArgument", len(l.Args), err)
	}
	l.Args = []Arg{Bytes(make([]byte, MaxParamBytes)), U32(1)}
	if _, err := DecodeRequest(OpLaunch, l.Append(nil)); !errors.Is(err, ErrBadArgument) {
		t.Errorf("oversized params: got %v, want ErrBadArgument", err)
	}
	b := (&Launch{Args: []Arg{U32(1)}}).Append(nil)
	b[len(b)-9] = 99 // the argument's kind byte
	if _, err := DecodeRequest(OpLaunch, b); !errors.Is(err, ErrBadArgument) {
		t.Errorf("unknown arg kind: got %v, want ErrBadArgument", err)
	}
}

func TestFrameRoundTrip(t *testing.T) {
	payload := (&Alloc{Size: 42}).Append(nil)
	var stream []byte
	stream = AppendFrame(stream, OpAlloc, 0, 1, payload)
	stream = AppendFrame(stream, OpSync, FlagAsync, 2, nil)
	fr := NewFrameReader(bytes.NewReader(stream), DefaultMaxPayload)
	f, err := fr.ReadFrame()
	if err != nil || f.Op != OpAlloc || f.RequestID != 1 || !bytes.Equal(f.Payload, payload) {
		t.Fatalf("first frame: %+v, %v", f, err)
	}
	f, err = fr.ReadFrame()
	if err != nil || f.Op != OpSync || f.Flags != FlagAsync || f.RequestID != 2 || len(f.Payload) != 0 {
		t.Fatalf("second frame: %+v, %v", f, err)
	}
	if _, err := fr.ReadFrame(); err != io.EOF {
		t.Fatalf("after last frame: %v, want io.EOF", err)
	}
}

func TestFrameErrors(t *testing.T) {
	good := AppendFrame(nil, OpAlloc, 0, 9, (&Alloc{Size: 1}).Append(nil))
	mutate := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	reseal := func(b []byte) []byte { // recompute the CRC after editing the header
		crc := crc32.Update(crc32.Update(0, castagnoli, b[:24]), castagnoli, b[HeaderSize:])
		binary.LittleEndian.PutUint32(b[24:], crc)
		return b
	}
	tests := []struct {
		name  string
		frame []byte
		check func(error) bool
	}{
		{"bad magic", mutate(func(b []byte) []byte { b[0] ^= 1; return b }), func(e error) bool { return errors.Is(e, ErrBadMagic) }},
		{"version 0", mutate(func(b []byte) []byte { b[4] = 0; return reseal(b) }), isVersion},
		{"next version", mutate(func(b []byte) []byte { b[4] = byte(Version + 1); return reseal(b) }), isVersion},
		{"opcode 0", mutate(func(b []byte) []byte { b[6] = 0; return reseal(b) }), func(e error) bool { return errors.Is(e, ErrBadOpcode) }},
		{"unknown opcode", mutate(func(b []byte) []byte { b[6] = 200; return reseal(b) }), func(e error) bool { return errors.Is(e, ErrBadOpcode) }},
		{"reserved bits", mutate(func(b []byte) []byte { b[10] = 1; return reseal(b) }), func(e error) bool { return errors.Is(e, ErrReserved) }},
		{"unknown flag", mutate(func(b []byte) []byte { b[8] = 0x80; return reseal(b) }), func(e error) bool { return errors.Is(e, ErrReserved) }},
		{"payload bit flip", mutate(func(b []byte) []byte { b[len(b)-1] ^= 0x10; return b }), func(e error) bool { return errors.Is(e, ErrChecksum) }},
		{"too large", mutate(func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[20:], 1<<30)
			return b
		}), func(e error) bool { var tl *TooLargeError; return errors.As(e, &tl) && tl.Header.RequestID == 9 }},
		{"cut mid-frame", good[:len(good)-3], func(e error) bool { return e == io.ErrUnexpectedEOF }},
		{"cut mid-header", good[:10], func(e error) bool { return e == io.ErrUnexpectedEOF }},
	}
	for _, tt := range tests {
		_, err := NewFrameReader(bytes.NewReader(tt.frame), DefaultMaxPayload).ReadFrame()
		if err == nil || !tt.check(err) {
			t.Errorf("%s: got error %v", tt.name, err)
		}
	}
}

func isVersion(e error) bool { var ve *VersionError; return errors.As(e, &ve) }

func TestSupportedVersions(t *testing.T) {
	if !Supported(Version) {
		t.Fatal("current version refused")
	}
	if Supported(0) || Supported(Version+1) {
		t.Fatal("version 0 or a future version accepted")
	}
	v := Version // a variable, so the arithmetic below may wrap at version 1
	if v > 1 && !Supported(v-1) {
		t.Fatal("previous version refused")
	}
	if v > 2 && Supported(v-2) {
		t.Fatal("version before the previous one accepted")
	}
}

func TestReplyRoundTrip(t *testing.T) {
	b := AppendReply(nil, StatusOK, "", &HelloReply{Session: 1, WindowBase: 2, WindowSize: 3, Term: 4, Applied: 5})
	var hr HelloReply
	st, msg, err := DecodeReply(b, &hr)
	if err != nil || st != StatusOK || msg != "" || !cmp.Equal(hr, HelloReply{1, 2, 3, 4, 5, nil}) {
		t.Fatalf("got %v %q %v %+v", st, msg, err, hr)
	}
	var sr StatusHelloReply
	if st, _, err := DecodeReply(AppendReply(nil, StatusOK, "", &StatusHelloReply{Term: 9}), &sr); err != nil || st != StatusOK || sr.Term != 9 {
		t.Fatalf("status_hello reply: %v %v %+v", st, err, sr)
	}
	if _, _, err := DecodeReply(AppendReply(nil, StatusOK, "", &Alloc{Size: 1})[:9], &sr); err == nil {
		t.Fatal("a short status_hello reply decoded")
	}
	b = AppendReply(nil, StatusOutOfRange, "nope", &AllocReply{Ptr: 5})
	var ar AllocReply
	st, msg, err = DecodeReply(b, &ar)
	if err != nil || st != StatusOutOfRange || msg != "nope" || ar.Ptr != 0 {
		t.Fatalf("error reply: got %v %q %v %+v", st, msg, err, ar)
	}
	if !errors.Is(error(st), StatusOutOfRange) {
		t.Fatal("status does not match itself with errors.Is")
	}
}

// TestReplyFrameInPlace: a reply frame encoded in place is the frame of
// the separately encoded reply, after what dst held, and a reader takes it.
func TestReplyFrameInPlace(t *testing.T) {
	for _, c := range []struct {
		st   Status
		msg  string
		body Body
	}{{StatusOK, "", &DataReply{Data: []byte("device bytes")}}, {StatusOK, "", nil}, {StatusOutOfRange, "nope", &AllocReply{Ptr: 5}}} {
		want := AppendFrameVersion([]byte("xy"), Version-1, OpCopyDtoH, FlagReply, 7, AppendReply(nil, c.st, c.msg, c.body))
		got := AppendReplyFrame([]byte("xy"), Version-1, OpCopyDtoH, 7, c.st, c.msg, c.body)
		if !bytes.Equal(got, want) {
			t.Fatalf("%v %q: in place %x, want %x", c.st, c.msg, got, want)
		}
		f, err := NewFrameReader(bytes.NewReader(got[2:]), 1<<10).ReadFrame()
		if err != nil || f.RequestID != 7 || f.Flags != FlagReply {
			t.Fatalf("reading it back: %+v %v", f, err)
		}
	}
}

func TestDim3CountSaturates(t *testing.T) {
	if n := (Dim3{1 << 31, 1 << 31, 4}).Count(); n != math.MaxUint64 {
		t.Fatalf("2^31·2^31·4 counted %d", n)
	}
	if n := (Dim3{1<<32 - 1, 1<<32 - 1, 1}).Count(); n != (1<<32-1)*(1<<32-1) {
		t.Fatalf("(2^32-1)^2 counted %d", n)
	}
}

// TestResumeToken: the token is an optional tail of hello and its reply
// (version 2): absent for a version-1 peer, else exactly ResumeTokenSize
// bytes.
func TestResumeToken(t *testing.T) {
	tok := bytes.Repeat([]byte{7}, ResumeTokenSize)
	h := &Hello{GuestName: "g", Resume: 3, GraceMS: 10, Token: tok}
	got, err := DecodeRequest(OpHello, h.Append(nil))
	if err != nil || !cmp.Equal(got, Body(h)) {
		t.Fatalf("hello with a token: %+v %v", got, err)
	}
	v1 := (&Hello{GuestName: "g", Resume: 3, GraceMS: 10}).Append(nil)
	if got, err := DecodeRequest(OpHello, v1); err != nil || got.(*Hello).Token != nil {
		t.Fatalf("version-1 hello: %+v %v", got, err)
	}
	if _, err := DecodeRequest(OpHello, h.Append(nil)[:len(v1)+ResumeTokenSize-1]); err == nil {
		t.Fatal("hello with a short token accepted")
	}
	var hr HelloReply
	b := AppendReply(nil, StatusOK, "", &HelloReply{Session: 1, Token: tok})
	if _, _, err := DecodeReply(b, &hr); err != nil || !bytes.Equal(hr.Token, tok) {
		t.Fatalf("hello reply with a token: %+v %v", hr, err)
	}
}

// TestGPUPin: a pinned hello carries its pin after a token field, zeros
// when it has no token; a node that knows no pin finds trailing bytes.
func TestGPUPin(t *testing.T) {
	tok := bytes.Repeat([]byte{7}, ResumeTokenSize)
	for _, h := range []*Hello{{GuestName: "g", GPU: "1"}, {GuestName: "g", Resume: 3, Token: tok, GPU: "GPU-abcd"}} {
		b := h.Append(nil)
		got, err := DecodeRequest(OpHello, b)
		if err != nil || !cmp.Equal(got, Body(h)) {
			t.Fatalf("pinned hello %+v: decoded %+v %v", h, got, err)
		}
		var old Decoder = Decoder{b: b} // a node that knows no pin
		(&Hello{}).decodeTokenOnly(&old)
		if old.Finish() == nil {
			t.Fatalf("a pinned hello reads whole without its pin")
		}
	}
	empty := append((&Hello{GuestName: "g"}).Append(nil), make([]byte, ResumeTokenSize)...)
	if _, err := DecodeRequest(OpHello, appendString(empty, "")); err == nil {
		t.Fatal("an empty pin accepted")
	}
	if _, err := DecodeRequest(OpHello, appendString(empty, string(bytes.Repeat([]byte{'1'}, MaxGPUPinLen+1)))); err == nil {
		t.Fatal("an over-long pin accepted")
	}
}

// decodeTokenOnly is Hello's decoder before pins (version 2).
func (m *Hello) decodeTokenOnly(d *Decoder) {
	m.GuestName, m.Resume, m.GraceMS, m.Token = d.String(MaxNameLen), d.U64(), d.U32(), d.token()
}

func TestModuleImage(t *testing.T) {
	m := &ModuleImage{Kernels: []KernelSpec{
		{Name: "a", Params: []ArgKind{ArgPtr, ArgU32}, PTX: ".entry a"},
		{Name: "b", PTX: ".entry b"},
	}}
	got, err := DecodeModuleImage(m.Append(nil))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(m, got); diff != "" {
		t.Fatalf("round trip (-want +got):\n%s", diff)
	}
	dup := &ModuleImage{Kernels: []KernelSpec{{Name: "a"}, {Name: "a"}}}
	for name, b := range map[string][]byte{
		"empty":     nil,
		"no kernel": (&ModuleImage{}).Append(nil),
		"duplicate": dup.Append(nil),
		"bad magic": append([]byte("XXXXXXXX"), m.Append(nil)[8:]...),
		"truncated": m.Append(nil)[:20],
	} {
		if _, err := DecodeModuleImage(b); !errors.Is(err, ErrBadImage) {
			t.Errorf("%s: got %v, want ErrBadImage", name, err)
		}
	}
}

func TestAppendBodyFrameMatchesAppendFrame(t *testing.T) {
	req := &CopyHtoD{Dst: 1, Data: bytes.Repeat([]byte{9}, 1000)}
	want := AppendFrame([]byte("prefix"), OpCopyHtoD, FlagAsync, 77, req.Append(nil))
	if got := AppendBodyFrame([]byte("prefix"), OpCopyHtoD, FlagAsync, 77, req); !bytes.Equal(got, want) {
		t.Fatal("AppendBodyFrame differs from AppendFrame of the same body")
	}
}

// countingBudget is a Budget with a limit that records what it holds.
type countingBudget struct {
	mu         sync.Mutex
	limit, now int
}

func (b *countingBudget) Acquire(n int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.now+n > b.limit {
		return false
	}
	b.now += n
	return true
}

func (b *countingBudget) Release(n int) { b.mu.Lock(); b.now -= n; b.mu.Unlock() }

func (b *countingBudget) held() int { b.mu.Lock(); defer b.mu.Unlock(); return b.now }

// TestFrameReaderGrowsAsBytesArrive: a header announcing 16 MiB commits no
// memory until the payload comes, then at most four times what came.
func TestFrameReaderGrowsAsBytesArrive(t *testing.T) {
	payload := bytes.Repeat([]byte{7}, 16<<20)
	frame := AppendFrame(nil, OpCopyHtoD, 0, 1, payload)
	pr, pw := io.Pipe()
	budget := &countingBudget{limit: 64 << 20}
	fr := NewFrameReader(pr, 16<<20)
	fr.SetBudget(budget)
	got := make(chan Frame)
	go func() {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Error(err)
		}
		got <- f
	}()
	pw.Write(frame[:HeaderSize])
	time.Sleep(10 * time.Millisecond)
	if budget.held() != 0 {
		t.Fatalf("a bare header holds %d bytes", budget.held())
	}
	sent := HeaderSize
	for _, upTo := range []int{100 << 10, 1 << 20, 5 << 20} {
		pw.Write(frame[sent:upTo])
		sent = upTo
		// A growth holds the old and the new buffer for a moment: judge
		// once the reader has settled (waiting for bytes that are not sent).
		limit, deadline := 4*sent+4*sent/8, time.Now().Add(2*time.Second)
		h := budget.held()
		for h > limit && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
			h = budget.held()
		}
		if h > limit {
			t.Fatalf("%d bytes received, %d held", sent, h)
		}
	}
	pw.Write(frame[sent:])
	f := <-got
	if !bytes.Equal(f.Payload, payload) {
		t.Fatal("payload differs")
	}
	fr.Release()
	if budget.held() != 0 {
		t.Fatalf("%d bytes held after Release", budget.held())
	}
}

// TestFrameReaderBudgetRefusal: a frame over budget is skipped and refused;
// the next frame reads.
func TestFrameReaderBudgetRefusal(t *testing.T) {
	big := AppendFrame(nil, OpCopyHtoD, 0, 1, make([]byte, 1<<20))
	small := AppendFrame(nil, OpSync, 0, 2, nil)
	fr := NewFrameReader(bytes.NewReader(append(big, small...)), 2<<20)
	fr.SetBudget(&countingBudget{limit: 512 << 10})
	if f, err := fr.ReadFrame(); !errors.Is(err, ErrBudget) || f.RequestID != 1 {
		t.Fatalf("frame over budget: %v (id %d)", err, f.RequestID)
	}
	if f, err := fr.ReadFrame(); err != nil || f.RequestID != 2 {
		t.Fatalf("frame after a refused one: %v (id %d)", err, f.RequestID)
	}
}

func TestDeviceInfoReplyRoundTrip(t *testing.T) {
	for _, want := range []*DeviceInfoReply{
		{Name: "dev", UUID: [16]byte{1, 2, 15: 3}, TotalMem: 1 << 30, Attrs: []int32{0, 1024, -1}, Granularity: 2 << 20},
		{Name: "dev", TotalMem: 1 << 30, Attrs: []int32{0, 7}, Granularity: 2 << 20, Limits: []uint64{1024, LimitUnsupported, 0}},
	} {
		var got DeviceInfoReply
		if err := Unmarshal(want.Append(nil), &got); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, &got); diff != "" {
			t.Errorf("round trip (-want +got):\n%s", diff)
		}
	}
	var got DeviceInfoReply
	noLimits := append((&DeviceInfoReply{Granularity: 1}).Append(nil), 0)
	if err := Unmarshal(noLimits, &got); err == nil {
		t.Error("accepted a count of zero limits (none are sent as nothing)")
	}
	if err := Unmarshal(binary.LittleEndian.AppendUint16(appendU64(append(appendString(nil, ""), make([]byte, 16)...), 0), MaxDeviceAttrs+1), &got); err == nil {
		t.Error("accepted more attributes than the limit")
	}
}

// TestLaunchCluster: a launch's cluster shape and its cooperative flag go
// after its arguments, only when set, and come back; an unknown launch
// flag is refused.
func TestLaunchCluster(t *testing.T) {
	for _, want := range []Launch{
		{Function: 1, Grid: Dim3{4, 1, 1}, Block: Dim3{32, 1, 1}, Args: []Arg{U32(1)}},
		{Function: 1, Grid: Dim3{4, 1, 1}, Block: Dim3{32, 1, 1}, Args: []Arg{U32(1)}, Cluster: Dim3{2, 1, 1}},
		{Function: 1, Grid: Dim3{4, 1, 1}, Block: Dim3{32, 1, 1}, Args: []Arg{U32(1)}, Cooperative: true},
		{Function: 1, Grid: Dim3{4, 1, 1}, Block: Dim3{32, 1, 1}, Args: []Arg{U32(1)}, Cluster: Dim3{2, 1, 1}, Cooperative: true},
	} {
		b := want.Append(nil)
		got, err := DecodeRequest(OpLaunch, b)
		if err != nil {
			t.Fatal(err)
		}
		if l := got.(*Launch); l.Cluster != want.Cluster || l.Cooperative != want.Cooperative {
			t.Errorf("cluster %v, cooperative %v came back as %v, %v", want.Cluster, want.Cooperative, l.Cluster, l.Cooperative)
		}
	}
	bad := (&Launch{Function: 1, Grid: Dim3{4, 1, 1}, Block: Dim3{32, 1, 1}, Cooperative: true}).Append(nil)
	bad[len(bad)-4] |= 2 // a launch flag nobody defined
	if _, err := DecodeRequest(OpLaunch, bad); !errors.Is(err, ErrBadArgument) {
		t.Errorf("an unknown launch flag: %v, want ErrBadArgument", err)
	}
}
