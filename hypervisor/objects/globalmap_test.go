package objects

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// TestGlobalMap: an address inside a module variable the guest holds at
// another node's address becomes the same offset in this node's copy, in
// 8-byte arguments and in every aligned word of a structure argument; an
// address of this node's own variables, other values, a short tail and the
// caller's arguments stay as they were; a later note for the same guest
// address replaces the earlier one.
func TestGlobalMap(t *testing.T) {
	var m globalMap
	m.note(globalRef{module: 1, name: "own", guest: 0x7f00_0000_0000, own: 0x7f00_0000_0000, size: 64})
	m.note(globalRef{module: 1, name: "a", guest: 0x7f8a_0000_1000, own: 0x7fdd_0000_2000, size: 0x100})
	m.note(globalRef{module: 2, name: "b", guest: 0x7f8a_0000_0000, own: 0x7fdd_0000_9000, size: 16})
	for _, c := range []struct{ in, want uint64 }{
		{0x7f8a_0000_1000, 0x7fdd_0000_2000},
		{0x7f8a_0000_10ff, 0x7fdd_0000_20ff},
		{0x7f8a_0000_1100, 0x7f8a_0000_1100}, // one past the end
		{0x7f8a_0000_0008, 0x7fdd_0000_9008},
		{0x7f8a_0000_0010, 0x7f8a_0000_0010},
		{0x7f00_0000_0008, 0x7f00_0000_0008}, // this node's own
		{42, 42},
	} {
		if got := m.local(c.in); got != c.want {
			t.Errorf("local(%#x) = %#x, want %#x", c.in, got, c.want)
		}
	}
	word := func(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }
	structure := append(append(append(word(3), word(0x7f8a_0000_1010)...), word(0x7e00_0000_0000)...), 9, 9)
	keep := append([]byte(nil), structure...)
	args := []abi.Arg{
		{Kind: abi.ArgU64, Bits: 0x7f8a_0000_0004},
		abi.Bytes(structure),
		{Kind: abi.ArgU32, Bits: 7},
	}
	got := m.args(args)
	if got[0].Bits != 0x7fdd_0000_9004 {
		t.Errorf("8-byte argument: %#x", got[0].Bits)
	}
	want := append(append(append(word(3), word(0x7fdd_0000_2010)...), word(0x7e00_0000_0000)...), 9, 9)
	if !bytes.Equal(got[1].Raw, want) {
		t.Errorf("structure: % x\nwant       % x", got[1].Raw, want)
	}
	if args[0].Bits != 0x7f8a_0000_0004 || !bytes.Equal(args[1].Raw, keep) {
		t.Error("args changed the caller's arguments")
	}
	plain := []abi.Arg{{Kind: abi.ArgU64, Bits: 5}}
	if out := m.args(plain); &out[0] != &plain[0] {
		t.Error("args copied arguments that hold no foreign address")
	}
	m.note(globalRef{module: 3, name: "c", guest: 0x7f8a_0000_1000, own: 0x7f8a_0000_1000, size: 8})
	if got := m.local(0x7f8a_0000_1004); got != 0x7f8a_0000_1004 {
		t.Errorf("after the guest address was noted as this node's own: %#x", got)
	}
}

// BenchmarkGlobalMapWords maps a 512-byte structure argument of words no
// module variable holds (counts, sizes, addresses in the guest's window),
// with sixteen foreign variables noted: each word searched (search) beside
// each word first checked against the variables' bounds (local).
func BenchmarkGlobalMapWords(b *testing.B) {
	var m globalMap
	for i := range uint64(16) {
		m.note(globalRef{module: 1, name: "v", guest: 0x7f8a_0000_0000 + i<<20, own: 0x7fdd_0000_0000 + i<<20, size: 4096})
	}
	raw := make([]byte, 512)
	for off := 0; off < len(raw); off += 8 {
		binary.LittleEndian.PutUint64(raw[off:], 0x7e00_0000_0000+uint64(off)*4096)
	}
	for _, f := range []struct {
		name string
		fn   func(uint64) uint64
	}{{"search", m.search}, {"local", m.local}} {
		b.Run(f.name, func(b *testing.B) {
			for b.Loop() {
				abi.MapAddresses([]abi.Arg{abi.Bytes(raw)}, f.fn)
			}
		})
	}
}
