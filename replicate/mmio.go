package replicate

import (
	"encoding/binary"
	"fmt"
)

// The body of an OpMMIO record: the aperture's device address, then its
// writes in order, each an offset, a length and the bytes:
//
//	ptr u64 | (off u64 | len u32 | data)...
//
// MaxMMIOBody bounds one record's body; longer flushes are split.
const MaxMMIOBody = 1 << 20

// AppendMMIOHeader starts an OpMMIO body for the aperture at ptr.
func AppendMMIOHeader(b []byte, ptr uint64) []byte { return binary.LittleEndian.AppendUint64(b, ptr) }

// AppendMMIOWrite adds one write to an OpMMIO body.
func AppendMMIOWrite(b []byte, off uint64, data []byte) []byte {
	b = binary.LittleEndian.AppendUint64(b, off)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(data)))
	return append(b, data...)
}

// DecodeMMIO checks an OpMMIO body whole, then calls fn for each write in
// order. fn is not called at all if the body is malformed.
func DecodeMMIO(body []byte, fn func(ptr, off uint64, data []byte) error) error {
	if len(body) < 8 {
		return fmt.Errorf("%w: mmio body of %d bytes", ErrBadRecord, len(body))
	}
	ptr := binary.LittleEndian.Uint64(body)
	for rest := body[8:]; len(rest) > 0; {
		if len(rest) < 12 {
			return fmt.Errorf("%w: mmio write header cut short", ErrBadRecord)
		}
		n := uint64(binary.LittleEndian.Uint32(rest[8:]))
		if n == 0 || n > uint64(len(rest)-12) {
			return fmt.Errorf("%w: mmio write of %d bytes, %d left", ErrBadRecord, n, len(rest)-12)
		}
		rest = rest[12+n:]
	}
	for rest := body[8:]; len(rest) > 0; {
		off := binary.LittleEndian.Uint64(rest)
		n := binary.LittleEndian.Uint32(rest[8:])
		if err := fn(ptr, off, rest[12:12+n]); err != nil {
			return err
		}
		rest = rest[12+n:]
	}
	return nil
}
