package abi

import (
	"bytes"
	"hash/crc32"
	"testing"
)

func checkCombine(t *testing.T, a, b []byte) {
	t.Helper()
	want := crc32.Checksum(append(append([]byte(nil), a...), b...), castagnoli)
	got := combineCRC(crc32.Checksum(a, castagnoli), crc32.Checksum(b, castagnoli), uint64(len(b)))
	if got != want {
		t.Fatalf("combineCRC over %d+%d bytes = %#x, want %#x", len(a), len(b), got, want)
	}
}

// TestCombineCRC: the combined sum equals the sum over the joined bytes,
// for empty and odd-sized parts and a frame-sized payload.
func TestCombineCRC(t *testing.T) {
	big := make([]byte, 3<<20+7)
	for i := range big {
		big[i] = byte(i * 31)
	}
	for _, sizes := range [][2]int{{0, 0}, {24, 0}, {0, 5}, {24, 1}, {24, 65536}, {1, 3<<20 + 7}, {24, 4096*3 + 1}} {
		checkCombine(t, big[:sizes[0]], big[len(big)-sizes[1]:])
	}
}

func FuzzCombineCRC(f *testing.F) {
	f.Add([]byte("VGPU header of twenty-four"), []byte("payload"))
	f.Fuzz(func(t *testing.T, a, b []byte) { checkCombine(t, a, b) })
}

// TestLargeFrameSumsItsPayload: a large frame read whole comes with its
// payload's own sum; a small one without; a large frame with one byte of
// its payload changed is refused.
func TestLargeFrameSumsItsPayload(t *testing.T) {
	for _, n := range []int{100, smallFrame, 3<<20 + 5} {
		payload := make([]byte, n)
		for i := range payload {
			payload[i] = byte(i * 7)
		}
		frame := AppendFrame(nil, OpCopyHtoD, 0, 9, payload)
		f, err := NewFrameReader(bytes.NewReader(frame), DefaultMaxPayload).ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		large := n >= smallFrame
		if f.PayloadSummed != large || (large && f.PayloadSum != crc32.Checksum(payload, castagnoli)) {
			t.Errorf("%d bytes: summed %v, sum %#x", n, f.PayloadSummed, f.PayloadSum)
		}
		frame[HeaderSize+n/2] ^= 1
		if _, err := NewFrameReader(bytes.NewReader(frame), DefaultMaxPayload).ReadFrame(); err != ErrChecksum {
			t.Errorf("%d bytes, one changed: %v, want ErrChecksum", n, err)
		}
	}
}
