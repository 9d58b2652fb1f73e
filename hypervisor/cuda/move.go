package cuda

import "slices"

// Overlapping device-to-device copies. CUDA leaves a cuMemcpyDtoD whose
// source and destination overlap undefined (the copy engines move pieces
// in parallel), and on an H100 a replica that replayed such a copy ended
// up with other bytes than its primary: verify failed after a resync of
// guests that copied within one buffer. The software GPU copies as
// memmove does, so the CUDA backend does too, and primary and standby
// agree with each other and with it: the copy goes through a staging
// buffer, moveChunk bytes at a time, front to back when the destination
// lies below the source and back to front otherwise, so no piece is read
// after it was overwritten. The staging buffer is one per context; the
// copy waits for its stream before it returns (under the context's lock,
// so no other copy uses the buffer meanwhile). Guests rarely overlap
// copies; those that do pay a synchronous copy.

// moveChunk is the staging buffer's size.
const moveChunk = 4 << 20

// overlaps reports whether [dst, dst+n) and [src, src+n) share bytes
// (without computing an end that could overflow).
func overlaps(dst, src, n uint64) bool {
	if dst >= src {
		return dst-src < n
	}
	return src-dst < n
}

// moveDtoD copies n bytes from src to dst on stream st as memmove does.
// Precondition: c.mu must be locked, the context current.
func (c *guestContext) moveDtoD(dst, src, n uint64, st uintptr) error {
	d := c.d
	if c.moveBuf == 0 {
		if err := d.check("cuMemAlloc(move staging)", d.cuMemAlloc(&c.moveBuf, moveChunk)); err != nil {
			return err
		}
	}
	var err error
	for _, off := range movePieces(dst, src, n, moveChunk) {
		k := min(moveChunk, n-off)
		if err = d.check("cuMemcpyDtoDAsync(move in)", d.cuMemcpyDtoDAsync(c.moveBuf, src+off, k, st)); err != nil {
			break
		}
		if err = d.check("cuMemcpyDtoDAsync(move out)", d.cuMemcpyDtoDAsync(dst+off, c.moveBuf, k, st)); err != nil {
			break
		}
	}
	if serr := d.check("cuStreamSynchronize(move)", d.cuStreamSynchronize(st)); err == nil {
		err = serr
	}
	return err
}

// movePieces is the order in which a move of n bytes from src to dst goes
// through a staging buffer of chunk bytes: the offsets of its pieces,
// front to back when dst lies below src, back to front otherwise, so that
// no piece of the source is read after a piece of the destination
// overwrote it.
func movePieces(dst, src, n, chunk uint64) []uint64 {
	offs := make([]uint64, 0, (n+chunk-1)/chunk)
	for off := uint64(0); off < n; off += chunk {
		offs = append(offs, off)
	}
	if dst > src {
		slices.Reverse(offs)
	}
	return offs
}
