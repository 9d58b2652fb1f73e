package standby_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/internal/kernels"
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
	f.Fuzz(func(t *testing.T, first, second []byte) {
		backend := sim.New(64 << 20)
		cfg := hypervisor.DefaultConfig()
		cfg.MemoryQuota = 16 << 20
		srv, err := hypervisor.NewServer(backend, cfg, prometheus.NewRegistry(), quiet())
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range [][]byte{first, second} {
			if r, err := replicate.DecodeRecord(b); err == nil {
				srv.ApplyRecord(&r)
			}
		}
		srv.Checksums()
		srv.ApplyRecord(&replicate.Record{Op: replicate.OpReset})
		if used := backend.Used(); used != 0 {
			t.Fatalf("%d device bytes held after reset", used)
		}
	})
}
