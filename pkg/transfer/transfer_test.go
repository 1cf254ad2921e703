package transfer

import (
	"bytes"
	"testing"
)

func TestSendDeliversPagesAndAuxThenCompletes_I8(t *testing.T) {
	for _, tcp := range []bool{false, true} {
		name := map[bool]string{false: "mem", true: "tcp"}[tcp]
		t.Run(name, func(t *testing.T) {
			l := UniformLayout(4, 64, 4096, 8, 64)
			g := newRig(t, l, l, tcp, SenderConfig{MaxChunkBytes: 16 << 10}, ReceiverConfig{PieceBytes: 4096})
			for i := 0; i < 4; i++ {
				fill(g.src.Buffer(i), uint64(i+1))
				memset(g.dst.Buffer(i), 0xAA)
			}
			src := []Run{{0, 5}, {10, 1}, {20, 7}}
			dst := []Run{{30, 3}, {40, 10}}
			aux := bytes.Repeat([]byte{7}, 64)
			k := Key{Room: 7, Nonce: 99}
			if err := g.rcv.Expect(Expectation{Key: k, Dst: SamePages(4, dst), AuxRow: 3}); err != nil {
				t.Fatal(err)
			}
			if err := waitDone(t, g.send(t, k, SamePages(4, src), SamePages(4, dst), aux)); err != nil {
				t.Fatalf("done: %v", err)
			}
			if r := g.ev.wait(t, k); r != "" {
				t.Fatalf("receiver outcome %q", r)
			}
			segs, _ := Pair(src, dst)
			for b := 0; b < 4; b++ {
				for _, s := range segs {
					got := g.dst.Pages(b, Run{s.Dst, s.Count})
					want := g.src.Pages(b, Run{s.Src, s.Count})
					if !bytes.Equal(got, want) {
						t.Fatalf("buffer %d segment %+v differs", b, s)
					}
				}
			}
			if !bytes.Equal(g.dst.AuxRow(3), aux) {
				t.Fatal("aux row not written")
			}
			g.rcv.Fence(k)
		})
	}
}
