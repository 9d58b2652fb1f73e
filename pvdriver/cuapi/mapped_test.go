package cuapi

import (
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
