package link_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/vgpuha/vgpuha/replicate/link"
	"github.com/vgpuha/vgpuha/replicate/link/linktest"
)

var testKey = []byte("0123456789abcdef0123456789abcdef")

func TestHandshake(t *testing.T) {
	p, s, perr, serr := linktest.Pair(t, testKey, testKey)
	if perr != nil || serr != nil {
		t.Fatalf("same key: %v / %v", perr, serr)
	}
	p.Write(link.MsgAck, []byte("hello"))
	p.Flush()
	typ, payload, err := s.Read()
	if err != nil || typ != link.MsgAck || string(payload) != "hello" {
		t.Fatalf("read %d %q %v", typ, payload, err)
	}
	_, _, perr, serr = linktest.Pair(t, []byte("another-key-entirely"), testKey)
	if !errors.Is(perr, link.ErrAuth) || !errors.Is(serr, link.ErrAuth) {
		t.Fatalf("different keys: primary %v, standby %v", perr, serr)
	}
}

// TestCorruptStream: a flipped bit anywhere in a frame, or a frame replayed
// from earlier in the stream, is refused.
func TestCorruptStream(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mangle func(frames [][]byte) []byte
	}{
		{"payload bit", func(f [][]byte) []byte { c := bytes.Clone(f[0]); c[link.FrameHeader+2] ^= 1; return c }},
		{"tag bit, crc fixed", func(f [][]byte) []byte { c := bytes.Clone(f[0]); c[len(c)-1] ^= 1; return refreshCRC(c) }},
		{"type changed, crc fixed", func(f [][]byte) []byte { c := bytes.Clone(f[0]); c[4] ^= 3; return refreshCRC(c) }},
		{"replay", func(f [][]byte) []byte { return append(bytes.Clone(f[0]), f[0]...) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, s, perr, serr := linktest.Pair(t, testKey, testKey)
			if perr != nil || serr != nil {
				t.Fatal(perr, serr)
			}
			// Capture the frame bytes the primary would send.
			var buf bytes.Buffer
			p.SetWriter(&buf)
			p.Write(link.MsgRecord, make([]byte, 48, 48+link.MacSize))
			p.Flush()
			frame := buf.Bytes()
			p.Raw.Write(tc.mangle([][]byte{frame}))
			var err error
			for i := 0; i < 2 && err == nil; i++ {
				_, _, err = s.Read()
			}
			if !errors.Is(err, link.ErrCorrupt) {
				t.Fatalf("mangled stream read as %v", err)
			}
		})
	}
}

// refreshCRC recomputes a frame's CRC, as an attacker who edits a frame can:
// only the AEAD tag stands in the way.
func refreshCRC(f []byte) []byte {
	binary.LittleEndian.PutUint32(f[12:], link.FrameCRC(f, f[link.FrameHeader:]))
	return f
}
