package transfer

import (
	"hash/crc32"
	"testing"
)

// BenchmarkShm_1MiB and BenchmarkShm_64KiBScattered are BenchmarkTCP_*'s workloads with
// both sides on --data-transport=shm (receiver in its child process, so CPU per GB is per
// side): compare GB/s with BenchmarkMemcpyReference and BenchmarkTCP_* of the same run
// (bench.sh runs them in rounds).
func BenchmarkShm_1MiB(b *testing.B) {
	b.Run("crc32c", func(b *testing.B) { benchTransferOver(b, shape1MiB, ChecksumCRC32C, KindShm) })
	b.Run("none", func(b *testing.B) { benchTransferOver(b, shape1MiB, ChecksumNone, KindShm) })
}

func BenchmarkShm_64KiBScattered(b *testing.B) {
	b.Run("crc32c", func(b *testing.B) { benchTransferOver(b, shape64KiBScat, ChecksumCRC32C, KindShm) })
	b.Run("none", func(b *testing.B) { benchTransferOver(b, shape64KiBScat, ChecksumNone, KindShm) })
}

// BenchmarkShmSlicedTransfer is BenchmarkSlicedTransfer with both sides on
// --data-transport=shm: decode copies each head slice from the prefill mapping itself
// (2 -> 4 gathers the source rows into whole destination pages, 4 -> 2 scatters whole
// source pages into half rows). Compare with BenchmarkSlicedTransfer and
// BenchmarkMemcpyReference of the same run.
func BenchmarkShmSlicedTransfer(b *testing.B) {
	for _, sh := range []benchShape{shape32KiB, shape2to4, shape4to2} {
		b.Run(sh.name, func(b *testing.B) { benchTransferOver(b, sh, ChecksumCRC32C, KindShm) })
	}
}

// BenchmarkSumAhead is prefill's checksum pass over 1 MiB chunks of cold source pages
// (256 MiB rotating, past the last-level cache): crc32c alone, and sumAhead (each 32 KiB
// block summed after touching the next one).
func BenchmarkSumAhead(b *testing.B) {
	const chunk, total = 1 << 20, 256 << 20
	r := openTestRegion(b, UniformLayout(1, total/chunk, chunk, 0, 0))
	buf := r.Buffer(0)
	fill(buf, 1)
	for _, bc := range []struct {
		name string
		sum  func(uint32, [][]byte) uint32
	}{
		{"plain", func(crc uint32, bufs [][]byte) uint32 {
			for _, p := range bufs {
				crc = crc32.Update(crc, castagnoli, p)
			}
			return crc
		}},
		{"touchahead", sumAhead},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(chunk)
			cpu := cpuSelf()
			for i := 0; i < b.N; i++ {
				off := (i * chunk) % total
				// Two runs of half a chunk, as a chunk over two buffers is.
				bc.sum(0, [][]byte{buf[off : off+chunk/2], buf[off+chunk/2 : off+chunk]})
			}
			b.ReportMetric((cpuSelf()-cpu).Seconds()/(float64(b.N)*chunk/1e9), "cpu-s/GB")
		})
	}
}
