package replicate

import (
	"encoding/binary"
	"fmt"

	"github.com/vgpuha/vgpuha/replicate/link"
	"github.com/vgpuha/vgpuha/replicate/verify"
)

// A verify reply (msgVerifyReply) carries the standby's checksums for one
// verification: its id, a count, and each object's sum.

const sumSize = 8 + 1 + 8 + 8 + 8

// EncodeSums encodes a verify reply, the standby's checksums for
// verification id (sent by its receiver).
func EncodeSums(id uint64, sums []verify.ObjectSum) []byte {
	b := binary.LittleEndian.AppendUint64(make([]byte, 0, 12+len(sums)*sumSize), id)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(sums)))
	for _, s := range sums {
		b = binary.LittleEndian.AppendUint64(b, s.Session)
		b = append(b, byte(s.Kind))
		b = binary.LittleEndian.AppendUint64(b, s.ID)
		b = binary.LittleEndian.AppendUint64(b, s.Size)
		b = binary.LittleEndian.AppendUint64(b, s.Sum)
	}
	return b
}

func decodeSums(b []byte) (uint64, []verify.ObjectSum, error) {
	if len(b) < 12 {
		return 0, nil, fmt.Errorf("%w: short verify reply", link.ErrCorrupt)
	}
	id, n := binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint32(b[8:])
	b = b[12:]
	if uint64(len(b)) != uint64(n)*sumSize {
		return 0, nil, fmt.Errorf("%w: verify reply of %d bytes for %d objects", link.ErrCorrupt, len(b), n)
	}
	sums := make([]verify.ObjectSum, n)
	for i := range sums {
		s := b[i*sumSize:]
		sums[i] = verify.ObjectSum{
			Session: binary.LittleEndian.Uint64(s), Kind: verify.ObjectKind(s[8]),
			ID: binary.LittleEndian.Uint64(s[9:]), Size: binary.LittleEndian.Uint64(s[17:]),
			Sum: binary.LittleEndian.Uint64(s[25:]),
		}
	}
	return id, sums, nil
}
