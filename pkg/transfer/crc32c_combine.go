package transfer

// crc32cCombine returns the crc32c of A followed by B from crcA (of A), crcB (of B) and
// B's length, so the copy workers of a shm chunk can each sum their own part of it and
// the chunk's crc is still the one prefill computed over the whole. It is zlib's
// crc32_combine over the reflected Castagnoli polynomial: crcA times x^(8*lenB) mod P, xor
// crcB (the pre- and post-conditioning of both cancel out).
func crc32cCombine(crcA, crcB uint32, lenB int64) uint32 {
	return multModP(xPow8nModP(uint64(lenB)), crcA) ^ crcB
}

// castagnoliReflected is the crc32c polynomial, bit-reversed (hash/crc32.Castagnoli).
const castagnoliReflected = 0x82f63b78

// multModP returns a times b modulo the polynomial, both in reflected bit order (x^0 is
// the top bit).
func multModP(a, b uint32) uint32 {
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

// x2kModP[k] is x^(2^k) modulo the polynomial: the squares x2nModP multiplies together.
var x2kModP = func() (t [32]uint32) {
	p := uint32(1) << 30 // x^1
	for k := range t {
		t[k] = p
		p = multModP(p, p)
	}
	return t
}()

// xPow8nModP returns x^(8n) modulo the polynomial: the shift by n zero bytes.
func xPow8nModP(n uint64) uint32 {
	p := uint32(1) << 31 // x^0
	for k := 3; n != 0; n, k = n>>1, k+1 {
		if n&1 != 0 {
			p = multModP(x2kModP[k&31], p)
		}
	}
	return p
}
