package devmem_test

import (
	"testing"

	"github.com/vgpuha/vgpuha/hypervisor/devmem"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/internal/guesterr"
	"github.com/vgpuha/vgpuha/hypervisor/sim"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

const (
	base = 0x7e0000000000
	gran = 2 << 20
)

// objects is a session without streams or an object limit.
type objects struct{}

func (objects) Stream(uint64) (gpu.Stream, error) { return 0, nil }
func (objects) CheckRoom() error                  { return nil }

// memory is a session's memory on the software GPU: a 64 MiB window and
// quota, 2 MiB granularity.
func memory(t *testing.T) (*devmem.Memory, *sim.Backend) {
	t.Helper()
	be := sim.New(256 << 20)
	ctx, err := be.NewContext(base, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctx.Close() })
	m := devmem.New(ctx, devmem.Config{MemoryQuota: 64 << 20, AllocAlign: gran, MaxPayload: 1 << 20, InPlaceBytes: func(string, int) {}}, base, 64<<20, 0)
	m.Attach(objects{}, nil)
	return m, be
}

func reserve(t *testing.T, m *devmem.Memory, r abi.AddressReserve) uint64 {
	t.Helper()
	reply, err := m.AddressReserve(&r)
	if err != nil {
		t.Fatalf("reserve %+v: %v", r, err)
	}
	return reply.(*abi.AllocReply).Ptr
}

// want checks err has status st (abi.StatusOK: no error).
func want(t *testing.T, what string, err error, st abi.Status) {
	t.Helper()
	if got := guesterr.StatusOf(err); got != st {
		t.Errorf("%s: status %v (%v), want %v", what, got, err, st)
	}
}

// TestReserveMapChecks: every size and address a guest sends is checked
// before anything changes: a reservation is aligned and inside the
// window, a mapping inside one reservation and over no other memory, an
// unmap whole mappings, a free of a reservation with mappings refused;
// overflowing values are refused, never wrapped.
func TestReserveMapChecks(t *testing.T) {
	m, be := memory(t)
	res := reserve(t, m, abi.AddressReserve{Size: 8 * gran, Align: 4 * gran})
	if res%(4*gran) != 0 || res < base {
		t.Fatalf("reservation at %#x", res)
	}
	for _, c := range []struct {
		what string
		r    abi.AddressReserve
		st   abi.Status
	}{
		{"zero", abi.AddressReserve{}, abi.StatusInvalidValue},
		{"not a granule multiple", abi.AddressReserve{Size: gran + 1}, abi.StatusInvalidValue},
		{"alignment not a power of two", abi.AddressReserve{Size: gran, Align: 3 * gran}, abi.StatusInvalidValue},
		{"huge alignment", abi.AddressReserve{Size: gran, Align: 1 << 63}, abi.StatusInvalidValue},
		{"larger than the window", abi.AddressReserve{Size: 1 << 40}, abi.StatusOutOfMemory},
		{"wrapping size", abi.AddressReserve{Size: ^uint64(0) &^ (gran - 1)}, abi.StatusOutOfMemory},
	} {
		_, err := m.AddressReserve(&c.r)
		want(t, "reserve "+c.what, err, c.st)
	}
	// A hint that is free is taken; one over a reservation is not.
	if got := reserve(t, m, abi.AddressReserve{Size: gran, Hint: base + 30*gran}); got != base+30*gran {
		t.Errorf("free hint %#x: got %#x", uint64(base+30*gran), got)
	}
	if got := reserve(t, m, abi.AddressReserve{Size: gran, Hint: res}); got == res {
		t.Errorf("hint over a reservation was taken")
	}
	for _, c := range []struct {
		what      string
		ptr, size uint64
		st        abi.Status
	}{
		{"outside every reservation", base + 40*gran, gran, abi.StatusOutOfRange},
		{"past the reservation's end", res + 7*gran, 2 * gran, abi.StatusOutOfRange},
		{"unaligned", res + 4096, gran, abi.StatusInvalidValue},
		{"zero", res, 0, abi.StatusInvalidValue},
		{"wrapping", ^uint64(0) &^ (gran - 1), gran, abi.StatusOutOfRange},
		{"larger than its reservation", res, 64 * gran, abi.StatusOutOfRange},
	} {
		_, err := m.MemMap(&abi.MemMap{Ptr: c.ptr, Size: c.size})
		want(t, "map "+c.what, err, c.st)
	}
	if m.Bytes() != 0 || be.Used() != 0 {
		t.Fatalf("refused maps left %d bytes (%d on the device)", m.Bytes(), be.Used())
	}
	_, err := m.MemMap(&abi.MemMap{Ptr: res, Size: 2 * gran})
	want(t, "map", err, abi.StatusOK)
	_, err = m.MemMap(&abi.MemMap{Ptr: res + 2*gran, Size: gran})
	want(t, "map after it", err, abi.StatusOK)
	_, err = m.MemMap(&abi.MemMap{Ptr: res + gran, Size: 2 * gran})
	want(t, "map over a mapping", err, abi.StatusInvalidValue)
	if !m.Contains(res+gran, 2*gran) || m.Contains(res+2*gran, 2*gran) {
		t.Error("Contains: mappings that follow one another are one range; past them is not")
	}
	want(t, "copy across both", m.CheckRange(res, 3*gran, "copy"), abi.StatusOK)
	_, err = m.AddressFree(&abi.AddressFree{Ptr: res, Size: 8 * gran})
	want(t, "free a reservation with mappings", err, abi.StatusInvalidValue)
	for _, c := range []struct {
		what      string
		ptr, size uint64
	}{
		{"part of a mapping", res, gran},
		{"a mapping and a gap", res + 2*gran, 2 * gran},
		{"from inside a mapping", res + gran, 2 * gran},
		{"wrapping", res, ^uint64(0)},
	} {
		_, err := m.MemUnmap(&abi.MemUnmap{Ptr: c.ptr, Size: c.size})
		want(t, "unmap "+c.what, err, abi.StatusInvalidValue)
	}
	_, err = m.MemUnmap(&abi.MemUnmap{Ptr: res, Size: 3 * gran})
	want(t, "unmap both", err, abi.StatusOK)
	if m.Bytes() != 0 || be.Used() != 0 {
		t.Fatalf("after the unmap: %d bytes (%d on the device)", m.Bytes(), be.Used())
	}
	_, err = m.AddressFree(&abi.AddressFree{Ptr: res, Size: 4 * gran})
	want(t, "free with the wrong size", err, abi.StatusInvalidValue)
	_, err = m.AddressFree(&abi.AddressFree{Ptr: res, Size: 8 * gran})
	want(t, "free", err, abi.StatusOK)
}

// TestAllocAvoidsReservations: plain allocations are never placed in a
// reservation, and a mapping never over an allocation.
func TestAllocAvoidsReservations(t *testing.T) {
	m, _ := memory(t)
	res := reserve(t, m, abi.AddressReserve{Size: 4 * gran})
	reply, err := m.Alloc(&abi.Alloc{Size: gran})
	if err != nil {
		t.Fatal(err)
	}
	if p := reply.(*abi.AllocReply).Ptr; p >= res && p < res+4*gran {
		t.Fatalf("allocation at %#x inside the reservation at %#x", p, res)
	}
	if got := reserve(t, m, abi.AddressReserve{Size: gran, Hint: reply.(*abi.AllocReply).Ptr}); got == reply.(*abi.AllocReply).Ptr {
		t.Fatal("a reservation was placed over an allocation")
	}
	var records []abi.Opcode
	m.MappingRecords(func(op abi.Opcode, _ abi.Body, _ uint64) { records = append(records, op) })
	if len(records) != 2 || records[0] != abi.OpAddressReserve {
		t.Errorf("resync records %v: want the two reservations", records)
	}
}
