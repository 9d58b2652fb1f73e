package pvdriver

import "unsafe"

// offsetIn reports where b lies in region: its offset, if all of b is
// inside region (b non-empty).
func offsetIn(region, b []byte) (uint64, bool) {
	if len(b) == 0 || len(region) == 0 {
		return 0, false
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(region)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if p < base || p-base > uintptr(len(region)-len(b)) || len(b) > len(region) {
		return 0, false
	}
	return uint64(p - base), true
}
