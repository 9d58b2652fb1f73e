package aperture

import (
	"errors"
	"fmt"
	"testing"

	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
)

// flat is device memory of one allocation at base, in host memory.
type flat struct {
	base uint64
	mem  []byte
}

func (f *flat) CheckRange(addr, n uint64, what string) error {
	if addr < f.base || n > uint64(len(f.mem)) || addr-f.base > uint64(len(f.mem))-n {
		return fmt.Errorf("%s: %w", what, abi.StatusOutOfRange)
	}
	return nil
}
func (f *flat) Write(addr uint64, data []byte) error { copy(f.mem[addr-f.base:], data); return nil }
func (f *flat) Read(buf []byte, addr uint64) error   { copy(buf, f.mem[addr-f.base:]); return nil }
func (f *flat) Checksum(addr, n uint64) (uint64, error) {
	return gpu.Checksum(f.mem[addr-f.base : addr-f.base+n]), nil
}

// TestApplyChecksEveryWrite: a body whose writes all lie in the session's
// memory is written; one with a write outside it, or whose address wraps,
// is refused before any of its writes lands.
func TestApplyChecksEveryWrite(t *testing.T) {
	const base = 0x7e0000000000
	dev := &flat{base: base, mem: make([]byte, 4096)}
	good := replicate.AppendMMIOWrite(replicate.AppendMMIOHeader(nil, base), 8, []byte{1, 2, 3, 4})
	if err := Apply(dev, good); err != nil {
		t.Fatal(err)
	}
	if dev.mem[8] != 1 || dev.mem[11] != 4 {
		t.Fatalf("the write did not land: % x", dev.mem[8:12])
	}
	for name, body := range map[string][]byte{
		"past the end": replicate.AppendMMIOWrite(replicate.AppendMMIOWrite(replicate.AppendMMIOHeader(nil, base), 16, []byte{9}), 4094, []byte{9, 9, 9, 9}),
		"wraps":        replicate.AppendMMIOWrite(replicate.AppendMMIOWrite(replicate.AppendMMIOHeader(nil, base), 16, []byte{9}), ^uint64(0)-base+17, []byte{9}), // base+offset is past 2^64
	} {
		if err := Apply(dev, body); !errors.Is(err, abi.StatusOutOfRange) {
			t.Errorf("%s: %v, want out of range", name, err)
		}
		if dev.mem[16] != 0 {
			t.Fatalf("%s: a refused body wrote its first write", name)
		}
	}
}
