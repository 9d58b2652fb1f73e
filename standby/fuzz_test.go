package standby_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/replica"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/kernels"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
)

// FuzzApply feeds a replica arbitrary records (what an authenticated but
// buggy or hostile primary could send): the standby must never panic, and
// closing every session must free all device memory.
func FuzzApply(f *testing.F) {
	img, _ := kernels.Image("vadd")
	rec := func(op replicate.Op, session, result uint64, body []byte) []byte {
		return replicate.AppendRecord(nil, &replicate.Record{Op: op, Session: session, Result: result, Body: body})
	}
	open := rec(replicate.OpSessionOpen, 1, 0x7e0000000000, []byte("g"))
	f.Add(open, rec(replicate.Op(abi.OpAlloc), 1, 0x7e0000000000, (&abi.Alloc{Size: 64}).Append(nil)))
	f.Add(open, rec(replicate.Op(abi.OpModuleLoad), 1, 1, (&abi.ModuleLoad{Image: img}).Append(nil)))
	f.Add(open, rec(replicate.OpSetNext, 1, 5, nil))
	f.Add(open, rec(replicate.OpGlobalAddr, 1, 0x7f8a00001000, (&abi.ModuleGlobal{Module: 1, Name: "v"}).Append(nil)))
	f.Add(open, rec(replicate.OpTensorMap, 1, 0, replicate.AppendTensorMap(nil, &abi.TensorMapEncode{DataType: 7, Rank: 1, Global: 0x7f8a00001000,
		Dims: [abi.MaxTensorRank]uint64{16}, Box: [abi.MaxTensorRank]uint32{16}, ElementStrides: [abi.MaxTensorRank]uint32{1}}, [abi.TensorMapBytes]byte{1})))
	// A placed reservation (a resync's); a mapping outside any.
	f.Add(open, replicate.AppendRecord(nil, &replicate.Record{Op: replicate.Op(abi.OpAddressReserve), Session: 1, Result: 0x7e0000400000,
		Flags: replicate.FlagPlaced, Body: (&abi.AddressReserve{Size: 8 << 20}).Append(nil)}))
	f.Add(open, rec(replicate.Op(abi.OpMemMap), 1, 0, (&abi.MemMap{Ptr: 0x7e0000400000, Size: 2 << 20}).Append(nil)))
	alloc := rec(replicate.Op(abi.OpAlloc), 1, 0x7e0000000000, (&abi.Alloc{Size: 1 << 20}).Append(nil))
	f.Add(alloc, rec(replicate.OpReadCheck, 1, 0, replicate.AppendReadCheck(nil, replicate.ReadCheck{Addr: 0x7e0000000000, N: 1 << 20, Sum: 5})))
	f.Add(alloc, rec(replicate.OpReadCheck, 1, 0, replicate.AppendReadCheck(nil, replicate.ReadCheck{Addr: 0x7e00000ff000, N: 1 << 63})))
	f.Fuzz(func(t *testing.T, first, second []byte) {
		backend := sim.New(64 << 20)
		cfg := hypervisor.DefaultConfig()
		cfg.MemoryQuota = 16 << 20
		srv, err := hypervisor.NewServer(backend, cfg, prometheus.NewRegistry(), quiet())
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range [][]byte{first, second} {
			r, err := replicate.DecodeRecord(b)
			switch {
			case err != nil:
			case r.Op == replicate.OpReadCheck: // the receiver's, not Apply's
				replica.New(srv, quiet()).ReadMatches(&r)
			default:
				replica.New(srv, quiet()).Apply(&r)
			}
		}
		srv.Checksums()
		replica.New(srv, quiet()).Apply(&replicate.Record{Op: replicate.OpReset})
		if used := backend.Used(); used != 0 {
			t.Fatalf("%d device bytes held after reset", used)
		}
	})
}

// FuzzApplyMMIO applies an arbitrary aperture-write record to a replica
// session holding one 4 KiB allocation: it must never panic, and a record
// that is refused must change nothing.
func FuzzApplyMMIO(f *testing.F) {
	const ptr = 0x7e0000000000
	good := replicate.AppendMMIOWrite(replicate.AppendMMIOHeader(nil, ptr), 8, []byte{1, 2, 3, 4})
	f.Add(good)
	f.Add(replicate.AppendMMIOWrite(replicate.AppendMMIOHeader(nil, ptr), 4094, []byte{1, 2, 3, 4})) // runs past the end
	f.Add(replicate.AppendMMIOWrite(good, 1<<62, []byte{9}))                                         // second write out of range
	f.Fuzz(func(t *testing.T, body []byte) {
		srv, err := hypervisor.NewServer(sim.New(64<<20), hypervisor.DefaultConfig(), prometheus.NewRegistry(), quiet())
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range []replicate.Record{
			{Op: replicate.OpSessionOpen, Session: 1, Result: ptr, Body: []byte("g")},
			{Op: replicate.Op(abi.OpAlloc), Session: 1, Result: ptr, Body: (&abi.Alloc{Size: 4096}).Append(nil)},
		} {
			if err := replica.New(srv, quiet()).Apply(&r); err != nil {
				t.Fatal(err)
			}
		}
		before := srv.Checksums()
		if err := replica.New(srv, quiet()).Apply(&replicate.Record{Op: replicate.OpMMIO, Session: 1, Body: body}); err != nil {
			if after := srv.Checksums(); after[0].Sum != before[0].Sum {
				t.Fatalf("a refused record changed device memory: %v", err)
			}
		}
	})
}
