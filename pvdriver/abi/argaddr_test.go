package abi

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// TestMapWords: every aligned word a structure argument holds that is a
// pinned address becomes its mirror's; other words, a short tail and the
// caller's bytes stay as they were.
func TestMapWords(t *testing.T) {
	const pinned, mirror = 0x7f00_0000_1000, 0x7e00_0020_0000
	translate := func(v uint64) uint64 {
		if v >= pinned && v < pinned+0x100 {
			return mirror + v - pinned
		}
		return v
	}
	le := func(words ...uint64) []byte {
		var b []byte
		for _, w := range words {
			b = binary.LittleEndian.AppendUint64(b, w)
		}
		return b
	}
	in := append(le(7, pinned+0x10, 0x7e00_0000_0000, pinned), 1, 2, 3)
	keep := append([]byte(nil), in...)
	got := mapWords(in, translate)
	want := append(le(7, mirror+0x10, 0x7e00_0000_0000, mirror), 1, 2, 3)
	if !bytes.Equal(got, want) {
		t.Errorf("mapWords: % x\nwant          % x", got, want)
	}
	if !bytes.Equal(in, keep) {
		t.Error("mapWords changed the caller's bytes")
	}
	plain := le(1, 2)
	if out := mapWords(plain, translate); &out[0] != &plain[0] {
		t.Error("mapWords copied a structure with no pinned address")
	}
	if out := mapWords([]byte{1, 2, 3}, translate); len(out) != 3 {
		t.Error("mapWords changed a structure shorter than a word")
	}
}
