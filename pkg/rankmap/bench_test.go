package rankmap

import (
	"testing"
	"time"
)

// BenchmarkApply2to4 applies a prefill 2 -> decode 4 MHA plan (8 heads of 256 bytes, 1024
// tokens: 1 MiB prefill pages, 512 KiB decode pages, 1024 runs of 512 bytes per copy) to one
// page of every rank, beside a plain copy of the same 2 MiB between the same buffers. sliced
// reports x_plain, its time over the plain copy's for the same iterations.
func BenchmarkApply2to4(b *testing.B) { benchApply(b, 2, 4, 256) }

// BenchmarkApply1to8SmallRuns is the same with 128-byte heads and decode TP 8: 1 MiB
// prefill pages become 1024 runs of 128 bytes per decode rank, the smallest runs a
// 64-dim bf16 GQA model gives.
func BenchmarkApply1to8SmallRuns(b *testing.B) { benchApply(b, 1, 8, 128) }

func benchApply(b *testing.B, tpP, tpD, headBytes int) {
	const heads = 8
	tokens := (1 << 20) / (heads / tpP * headBytes) // 1 MiB prefill pages
	side := func(tp int) Topology {
		return Topology{TP: tp, Attention: MHA, Buffers: []Buffer{{PageTokens: tokens, TotalHeads: heads, RankHeads: heads / tp, HeadBytes: headBytes}}}
	}
	m, err := Plan(side(tpP), side(tpD))
	if err != nil {
		b.Fatal(err)
	}
	src := make([][]byte, tpP)
	for i := range src {
		src[i] = make([]byte, 1<<20)
		for j := range src[i] {
			src[i][j] = byte(j)
		}
	}
	dstLen := m.Decode.Buffers[0].ItemLen()
	dst := make([][]byte, tpD)
	for i := range dst {
		dst[i] = make([]byte, dstLen)
	}
	total := int64(tpD * dstLen)
	// plain moves the same bytes between the same buffers, one contiguous piece per decode rank
	perSrc := tpD / tpP
	plain := func() {
		for d := range dst {
			copy(dst[d], src[d/perSrc][(d%perSrc)*dstLen:])
		}
	}
	sliced := func() {
		for d, dr := range m.DecodeRanks {
			for _, c := range dr.Copies {
				c.Apply(dst[d], src[c.From])
			}
		}
	}
	b.Run("plain", func(b *testing.B) {
		b.SetBytes(total)
		for b.Loop() {
			plain()
		}
	})
	b.Run("sliced", func(b *testing.B) {
		b.SetBytes(total)
		start := time.Now()
		for i := 0; i < b.N; i++ {
			sliced()
		}
		slicedTime := time.Since(start)
		b.StopTimer()
		start = time.Now()
		for i := 0; i < b.N; i++ {
			plain()
		}
		b.ReportMetric(float64(slicedTime)/float64(time.Since(start)), "x_plain")
	})
}

// BenchmarkPlan is the REGISTER-time cost of planning a large pair: prefill 8 -> decode 1,
// 160 buffers (80 layers of K and V).
func BenchmarkPlan(b *testing.B) {
	side := func(tp int) Topology {
		t := Topology{TP: tp, Attention: MHA, AuxRowBytes: 4096}
		for range 160 {
			t.Buffers = append(t.Buffers, Buffer{PageTokens: 64, TotalHeads: 8, RankHeads: 8 / tp, HeadBytes: 256})
		}
		return t
	}
	p, d := side(8), side(1)
	for b.Loop() {
		if _, err := Plan(p, d); err != nil {
			b.Fatal(err)
		}
	}
}
