package transfer

import "testing"

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
