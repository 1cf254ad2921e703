package transfer

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// TestCrc32cCombineEqualsWholeChecksum: the crc32c of two parts combined is the crc32c of
// the whole, for every split of buffers up to a few pages and for empty parts.
func TestCrc32cCombineEqualsWholeChecksum(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	for _, n := range []int{0, 1, 7, 64, 4096, 65536 + 13, 3 << 20} {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		whole := crc32.Checksum(b, castagnoli)
		for _, cut := range []int{0, n / 3, n / 2, n - 1, n} {
			cut = max(0, min(cut, n))
			got := crc32cCombine(crc32.Checksum(b[:cut], castagnoli), crc32.Checksum(b[cut:], castagnoli), int64(n-cut))
			if got != whole {
				t.Fatalf("%d bytes cut at %d: combined %08x, whole %08x", n, cut, got, whole)
			}
		}
	}
}

func FuzzCrc32cCombine(f *testing.F) {
	f.Add([]byte("prefill pages"), uint16(4))
	f.Add(make([]byte, 1000), uint16(999))
	f.Fuzz(func(t *testing.T, b []byte, cut uint16) {
		c := min(int(cut), len(b))
		got := crc32cCombine(crc32.Checksum(b[:c], castagnoli), crc32.Checksum(b[c:], castagnoli), int64(len(b)-c))
		if want := crc32.Checksum(b, castagnoli); got != want {
			t.Fatalf("cut at %d of %d: combined %08x, whole %08x", c, len(b), got, want)
		}
	})
}
