package shm

import (
	"encoding/binary"
	"errors"
	"testing"
)

// FuzzHello: the hypervisor's decoder of a guest's opening message never
// panics and accepts only sizes it can map.
func FuzzHello(f *testing.F) {
	f.Add(appendHello(nil, MinRing, MinRing, 0))
	f.Add(appendHello(nil, DefaultRing, MaxRing, DefaultHostMemory))
	f.Add(appendHello(nil, MaxRing*2, MinRing, 0))
	f.Add(appendHello(nil, MinRing, MinRing, MaxHostMemory+hostMemoryAlign))
	f.Add(appendHello(nil, MinRing, MinRing, 4097))
	f.Add([]byte("VGPU"))
	f.Fuzz(func(t *testing.T, b []byte) {
		req, rep, host, err := decodeHello(b)
		if err != nil {
			if !errors.Is(err, ErrHandshake) {
				t.Fatalf("error %v does not wrap ErrHandshake", err)
			}
			return
		}
		if !validRing(req) || !validRing(rep) || areaSize(req, rep) > ctlBytes+2*MaxRing {
			t.Fatalf("accepted rings %d, %d", req, rep)
		}
		if host > MaxHostMemory || host%hostMemoryAlign != 0 {
			t.Fatalf("accepted a host-memory region of %d bytes", host)
		}
	})
}

// FuzzRing: whatever the peer wrote into a ring's control words and bytes,
// the consuming and producing sides never read or write outside the area,
// never hand out more than the ring holds, and report ErrCorrupt for an
// impossible index. The input is: our index (8 bytes), the peer's head
// and tail (8 each), then ring bytes.
func FuzzRing(f *testing.F) {
	seed := func(pos, head, tail uint64, data string) []byte {
		b := binary.LittleEndian.AppendUint64(nil, pos)
		b = binary.LittleEndian.AppendUint64(b, head)
		b = binary.LittleEndian.AppendUint64(b, tail)
		return append(b, data...)
	}
	f.Add(seed(0, 5, 0, "hello"))
	f.Add(seed(MinRing-3, MinRing+4, MinRing-3, "wrapped!"))
	f.Add(seed(10, 3, 0, ""))              // head behind our tail
	f.Add(seed(0, MinRing+1, 0, ""))       // more than the ring holds
	f.Add(seed(1<<63, 1<<63+7, 1<<63, "")) // huge but consistent
	f.Add(seed(^uint64(0)-2, 4, 0, "xyz")) // indexes wrapping 2^64
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) < 24 {
			return
		}
		pos := binary.LittleEndian.Uint64(in)
		head, tail := binary.LittleEndian.Uint64(in[8:]), binary.LittleEndian.Uint64(in[16:])
		area := make([]byte, areaSize(MinRing, MinRing))
		copy(area[ctlBytes:], in[24:])
		for consume := range 2 {
			r, err := newRing(area, consume, MinRing, MinRing)
			if err != nil {
				t.Skip(err) // the heap gave a misaligned block: not what is fuzzed
			}
			r.head.Store(head)
			r.tail.Store(tail)
			r.pos = pos
			p := make([]byte, 3*MinRing)
			if n, err := r.readable(); err == nil {
				if n > MinRing {
					t.Fatalf("readable %d > ring", n)
				}
				if k := r.take(p, n); uint64(k) > n || r.tail.Load() != pos+uint64(k) {
					t.Fatalf("took %d of %d, tail %d", k, n, r.tail.Load())
				}
			} else if !errors.Is(err, ErrCorrupt) || head-pos <= MinRing {
				t.Fatalf("readable: %v with head-pos %d", err, head-pos)
			}
			r.pos = pos
			r.seenTail = pos - MinRing // the room it saw is used up: writable loads the shared tail
			if free, err := r.writable(); err == nil {
				if free > MinRing {
					t.Fatalf("writable %d > ring", free)
				}
				r.put(p, free)
			} else if !errors.Is(err, ErrCorrupt) {
				t.Fatal(err)
			}
		}
	})
}
