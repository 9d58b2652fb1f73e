package abi

// A frame's checksum is the CRC32C of its header's first 24 bytes and its
// payload. A reader of a large frame sums the payload alone and combines
// that with the header's sum (combineCRC), so that the payload's own sum,
// which a node keeps for exactly-once (Frame.PayloadSum), costs no second
// pass over the bytes. The combination is the polynomial arithmetic of
// zlib's crc32_combine, for Castagnoli's polynomial.

// castagnoliReflected is Castagnoli's polynomial, bit-reflected.
const castagnoliReflected = 0x82F63B78

// mulModP returns a·b modulo the polynomial, both in the CRC's reflected
// representation (x^0 is the top bit).
func mulModP(a, b uint32) uint32 {
	var p uint32
	for m := uint32(1) << 31; m != 0; m >>= 1 {
		if a&m != 0 {
			p ^= b
		}
		if b&1 != 0 {
			b = b>>1 ^ castagnoliReflected
		} else {
			b >>= 1
		}
	}
	return p
}

// xPow2k holds x^(2^k) modulo the polynomial, for k up to 63.
var xPow2k = func() (t [64]uint32) {
	t[0] = 1 << 30 // x^1
	for k := 1; k < len(t); k++ {
		t[k] = mulModP(t[k-1], t[k-1])
	}
	return t
}()

// xPow8n returns x^(8n) modulo the polynomial: the shift that n bytes
// appended to a message apply to its sum.
func xPow8n(n uint64) uint32 {
	p := uint32(1) << 31 // x^0
	for k := 3; n != 0; k++ {
		if n&1 != 0 {
			p = mulModP(xPow2k[k&63], p)
		}
		n >>= 1
	}
	return p
}

// combineCRC returns the CRC32C of a followed by b, given sumA, the
// CRC32C of a, sumB, that of b, and lenB, the length of b.
func combineCRC(sumA, sumB uint32, lenB uint64) uint32 {
	return mulModP(xPow8n(lenB), sumA) ^ sumB
}
