package cuapi

import (
	"bytes"
	"encoding/binary"
	"reflect"
	"testing"
)

func TestChangedRuns(t *testing.T) {
	many := make([]byte, 4*mirrorRuns+8)
	manyWas := make([]byte, len(many))
	for i := 1; i < len(many); i += 4 {
		many[i] = 1
	}
	for _, c := range []struct {
		name     string
		now, was []byte
		want     [][2]int
	}{
		{"equal", []byte{1, 2, 3}, []byte{1, 2, 3}, nil},
		{"one byte", []byte{1, 9, 3}, []byte{1, 2, 3}, [][2]int{{1, 2}}},
		{"two runs", []byte{9, 9, 3, 9}, []byte{1, 2, 3, 4}, [][2]int{{0, 2}, {3, 4}}},
		{"all", []byte{9, 9}, []byte{1, 2}, [][2]int{{0, 2}}},
		{"past the run bound: one span", many, manyWas, [][2]int{{1, len(many) - 2}}},
	} {
		if got := changedRuns(c.now, c.was); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// TestMirrorWords: every aligned word a structure argument holds that is a
// pinned address becomes its mirror's; other words, a short tail and the
// caller's bytes stay as they were.
func TestMirrorWords(t *testing.T) {
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
	got := mirrorWords(in, translate)
	want := append(le(7, mirror+0x10, 0x7e00_0000_0000, mirror), 1, 2, 3)
	if !bytes.Equal(got, want) {
		t.Errorf("mirrorWords: % x\nwant          % x", got, want)
	}
	if !bytes.Equal(in, keep) {
		t.Error("mirrorWords changed the caller's bytes")
	}
	plain := le(1, 2)
	if out := mirrorWords(plain, translate); &out[0] != &plain[0] {
		t.Error("mirrorWords copied a structure with no pinned address")
	}
	if out := mirrorWords([]byte{1, 2, 3}, translate); len(out) != 3 {
		t.Error("mirrorWords changed a structure shorter than a word")
	}
}
