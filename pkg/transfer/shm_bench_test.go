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
