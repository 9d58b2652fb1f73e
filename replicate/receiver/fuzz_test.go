package receiver

import (
	"encoding/binary"
	"hash/crc32"
	"testing"

	"github.com/vgpuha/vgpuha/replicate/link"
)

// FuzzRecordParts: authentic frames (sealed with the key, in counter
// order) in any shape, whole records, record beginnings, parts of any
// length and heartbeats, never panic the receiver nor leak a lent buffer,
// and a record it applies is one that was sent whole: its body is exactly
// the one it was encoded with.
func FuzzRecordParts(f *testing.F) {
	f.Add([]byte{0, 5, 1, 0, 2, 0xff, 2, 0xff, 2, 0xfe, 0, 1})
	f.Add([]byte{1, 3, 2, 0xff, 3, 0, 2, 0xff, 2, 0xff})
	f.Add([]byte{2, 7, 1, 1, 1, 1})
	f.Fuzz(func(t *testing.T, script []byte) {
		if len(script) > 64 {
			return
		}
		p, s := linkPair(t)
		bodies := map[uint64]int{} // record index -> body bytes it was encoded with
		withTag := func(b []byte) []byte { return append(make([]byte, 0, len(b)+link.MacSize), b...) }
		var frames [][]byte
		var enc []byte // the record whose parts are being sent
		off := 0
		for i := 0; i+1 < len(script); i += 2 {
			op, arg := script[i]%4, int(script[i+1])
			switch op {
			case 0: // a whole record
				bodies[uint64(i)] = arg
				frames = append(frames, capture(p, func() { p.Write(link.MsgRecord, withTag(patternRecord(i, arg))) }))
			case 1: // a beginning, a little over partBytes
				bodies[uint64(i)] = link.PartBytes + arg*1000
				enc, off = patternRecord(i, bodies[uint64(i)]), 0
				frames = append(frames, capture(p, func() {
					p.Write(link.MsgRecordBegin, withTag(binary.LittleEndian.AppendUint64(nil, uint64(len(enc)))))
				}))
			case 2: // the next part: the right length at 0xff, else arg*4099 bytes
				n := max(0, min(link.PartBytes, len(enc)-off))
				if arg != 0xff {
					n = arg * 4099
				}
				part := make([]byte, n)
				if off < len(enc) {
					copy(part, enc[off:])
				}
				off += n
				frames = append(frames, capture(p, func() { p.Write(link.MsgRecordPart, withTag(part)) }))
			case 3:
				frames = append(frames, capture(p, func() { p.Write(link.MsgHeartbeat, withTag(make([]byte, 8))) }))
			}
		}
		rep := receive(t, p, s, frames) // fails on a lent buffer not given back
		for _, i := range rep.order {
			n, sent := bodies[i]
			if !sent || rep.sums[i] != crc32.Checksum(mustDecode(t, patternRecord(int(i), n)).Body, castagnoli) {
				t.Fatalf("record %d applied with bytes it was not sent with", i)
			}
		}
	})
}
