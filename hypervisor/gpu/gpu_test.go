package gpu

import "testing"

func TestChecksum(t *testing.T) {
	a := make([]byte, 100)
	base := Checksum(a)
	seen := map[uint64]bool{base: true}
	for i := range a { // every single-byte change shows
		a[i] = 1
		s := Checksum(a)
		if seen[s] {
			t.Fatalf("changing byte %d gave a checksum seen before", i)
		}
		seen[s] = true
		a[i] = 0
	}
	if Checksum(a[:99]) == Checksum(a) {
		t.Fatal("length not mixed in: trailing zero byte invisible")
	}
	// Summing in parts (as the GPU does) gives the same result.
	var sum uint64
	for i := uint64(0); i < 12; i++ {
		sum += uint64(a[8*i]) * (2*i + 1)
	}
	if FinishChecksum(sum, 12, a[96:]) != Checksum(a) {
		t.Fatal("FinishChecksum disagrees with Checksum")
	}
}
