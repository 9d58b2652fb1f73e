package cuapi

import (
	"slices"
	"testing"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

func TestVisibleDevices(t *testing.T) {
	a := [16]byte{0x4d, 0x2c, 0x11, 0x22, 15: 1}
	b := [16]byte{0x4d, 0x2c, 0x99, 0x22, 15: 2}
	two := [][16]byte{a, b}
	for _, c := range []struct {
		spec string
		set  bool
		want []int
	}{
		{"", false, []int{0, 1}},
		{"", true, nil},
		{"0", true, []int{0}},
		{"1,0", true, []int{1, 0}},
		{" 1 , 0 ", true, []int{1, 0}},
		{"2", true, nil},
		{"0,2,1", true, []int{0}}, // the list ends at the first device not served
		{"0,0", true, []int{0}},   // or one already named
		{"-1", true, nil},
		{abi.UUIDString(b), true, []int{1}},
		{"GPU-4d2c99", true, []int{1}},
		{"GPU-4D2C11", true, []int{0}},
		{"GPU-4d2c", true, nil}, // ambiguous
		{"GPU-", true, nil},
		{"MIG-4d2c11", true, nil},
		{abi.UUIDString(a) + ",1", true, []int{0, 1}},
	} {
		if got := VisibleDevices(c.spec, c.set, two); !slices.Equal(got, c.want) {
			t.Errorf("CUDA_VISIBLE_DEVICES=%q (set %v): %v, want %v", c.spec, c.set, got, c.want)
		}
	}
	if got := abi.UUIDString(a); got != "GPU-4d2c1122-0000-0000-0000-000000000001" {
		t.Errorf("UUIDString: %s", got)
	}
}
