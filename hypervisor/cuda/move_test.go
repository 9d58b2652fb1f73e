package cuda

import (
	"bytes"
	"testing"
)

// moveThroughStaging does on bytes what moveDtoD does on device memory.
func moveThroughStaging(buf []byte, dst, src, n, chunk uint64) {
	stage := make([]byte, chunk)
	for _, off := range movePieces(dst, src, n, chunk) {
		k := min(chunk, n-off)
		copy(stage, buf[src+off:src+off+k])
		copy(buf[dst+off:dst+off+k], stage[:k])
	}
}

// FuzzMovePieces: a move through the staging buffer, in movePieces' order,
// leaves what memmove leaves, for any overlap and chunk size (the GPU test
// TestOverlappingCopyIsMemmove checks the device does the same).
func FuzzMovePieces(f *testing.F) {
	f.Add(uint16(8), uint16(0), uint16(300), uint16(64))
	f.Add(uint16(0), uint16(8), uint16(300), uint16(64))
	f.Add(uint16(1), uint16(0), uint16(999), uint16(1))
	f.Add(uint16(100), uint16(37), uint16(500), uint16(700))
	f.Fuzz(func(t *testing.T, dst, src, n, chunk uint16) {
		const size = 1 << 12
		d, s, k, c := uint64(dst%size), uint64(src%size), uint64(n), uint64(chunk%512)+1
		k = min(k, size-d, size-s)
		if k == 0 {
			return
		}
		buf := make([]byte, size)
		for i := range buf {
			buf[i] = byte(i * 31)
		}
		want := bytes.Clone(buf)
		copy(want[d:d+k], want[s:s+k])
		moveThroughStaging(buf, d, s, k, c)
		if !bytes.Equal(buf, want) {
			t.Fatalf("move of %d bytes from %d to %d in %d-byte pieces differs from memmove", k, s, d, c)
		}
	})
}

func TestOverlaps(t *testing.T) {
	for _, c := range []struct {
		dst, src, n uint64
		want        bool
	}{
		{0, 8, 8, false}, {0, 8, 9, true}, {8, 0, 9, true}, {8, 0, 8, false},
		{0, ^uint64(0) - 4, 10, false}, {^uint64(0) - 4, ^uint64(0) - 8, 5, true},
	} {
		if got := overlaps(c.dst, c.src, c.n); got != c.want {
			t.Errorf("overlaps(%#x, %#x, %d) = %v, want %v", c.dst, c.src, c.n, got, c.want)
		}
	}
}
