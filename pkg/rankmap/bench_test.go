package rankmap

import (
	"testing"
	"time"
)

// BenchmarkApply2to4 applies a prefill 2 -> decode 4 MHA plan (8 heads of 256 bytes, 1024
// tokens: 1 MiB prefill pages, 512 KiB decode pages, 1024 runs of 512 bytes per copy) to one
// page of every rank, beside a plain copy of the same 2 MiB. sliced reports x_plain, its
// time over the plain copy's for the same iterations.
func BenchmarkApply2to4(b *testing.B) {
	side := func(tp int) Topology {
		return Topology{TP: tp, Attention: MHA, Buffers: []Buffer{{PageTokens: 1024, TotalHeads: 8, RankHeads: 8 / tp, HeadBytes: 256}}}
	}
	m, err := Plan(side(2), side(4))
	if err != nil {
		b.Fatal(err)
	}
	src := [][]byte{make([]byte, 1<<20), make([]byte, 1<<20)}
	for _, s := range src {
		for i := range s {
			s[i] = byte(i)
		}
	}
	dst := make([][]byte, 4)
	for i := range dst {
		dst[i] = make([]byte, 1<<19)
	}
	flat := make([]byte, 2<<20)
	plain := func() {
		copy(flat[:1<<20], src[0])
		copy(flat[1<<20:], src[1])
	}
	sliced := func() {
		for d, dr := range m.DecodeRanks {
			for _, c := range dr.Copies {
				c.Apply(dst[d], src[c.From])
			}
		}
	}
	b.Run("plain", func(b *testing.B) {
		b.SetBytes(2 << 20)
		for b.Loop() {
			plain()
		}
	})
	b.Run("sliced", func(b *testing.B) {
		b.SetBytes(2 << 20)
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
