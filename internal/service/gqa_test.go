package service

import (
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/rankmap"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// gqaShape is a GQA model of heads KV heads of mhaHeadBytes bytes in
// mhaPageTokens-token pages, served at prefill TP pre and decode TP dec,
// where at least one side has fewer heads than ranks.
type gqaShape struct{ heads, pre, dec int }

// rankHeads is SGLang's kv_head_num: heads/tp, at least one.
func (s gqaShape) rankHeads(tp int) int { return max(s.heads/tp, 1) }

// heldHead is the global head that local head h of rank r of a TP-tp side
// holds, by SGLang's rule (QKVParallelLinear: kv_tp_rank //
// num_kv_head_replicas when heads < tp, consecutive ranks sharing a head).
func (s gqaShape) heldHead(tp, r, h int) int {
	if s.heads >= tp {
		return r*(s.heads/tp) + h
	}
	return r / (tp / s.heads)
}

func (s gqaShape) layout(rank transfer.Rank) transfer.Layout {
	n := s.rankHeads(int(rank.Size))
	l := transfer.UniformLayout(2, 64, int64(mhaPageTokens*n*mhaHeadBytes), 8, 64)
	l.Rank = rank
	return l.WithHeads(rankmap.MHA, mhaPageTokens, int64(s.heads), mhaHeadBytes)
}

// gqaByte is byte j of global head g of token tok at page position pos of
// buffer b: the request's KV as every rank holding that head holds it (an
// engine's replicas of a head are the same bytes).
func gqaByte(b, pos, tok, g, j int) byte { return byte(b*31 + pos*13 + tok*5 + g*17 + j) }

// fill writes every prefill rank's pages of the request (src(rank)) from
// the model's KV, and the same aux row on every rank.
func (s gqaShape) fill(p *tpPair, src func(int) []int32) {
	for r, pre := range p.pre {
		n := s.rankHeads(s.pre)
		for b := range pre.layout.Buffers {
			for pos, pg := range src(r) {
				page := pre.mem.Pages(b, transfer.Run{Start: pg, Count: 1})
				for tok := range mhaPageTokens {
					for h := range n {
						for j := range mhaHeadBytes {
							page[(tok*n+h)*mhaHeadBytes+j] = gqaByte(b, pos, tok, s.heldHead(s.pre, r, h), j)
						}
					}
				}
			}
		}
		copy(pre.mem.AuxRow(int64(r)), "the-first-token")
	}
}

// check fails t unless every byte of every decode rank's pages is the
// model's KV of the heads that rank holds (computed here from SGLang's
// rule, not from rankmap) and its aux row is the request's.
func (s gqaShape) check(t *testing.T, p *tpPair, dst func(int) []int32) {
	t.Helper()
	n := s.rankHeads(s.dec)
	for d, dec := range p.dec {
		for b := range dec.layout.Buffers {
			for pos, pg := range dst(d) {
				page := dec.mem.Pages(b, transfer.Run{Start: pg, Count: 1})
				for tok := range mhaPageTokens {
					for h := range n {
						g := s.heldHead(s.dec, d, h)
						for j := range mhaHeadBytes {
							if got, want := page[(tok*n+h)*mhaHeadBytes+j], gqaByte(b, pos, tok, g, j); got != want {
								t.Fatalf("decode rank %d buffer %d page %d token %d local head %d (head %d) byte %d: %d, want %d",
									d, b, pg, tok, h, g, j, got, want)
							}
						}
					}
				}
			}
		}
		if got := string(dec.mem.AuxRow(int64(7 - d))[:15]); got != "the-first-token" {
			t.Fatalf("decode rank %d aux row %q", d, got)
		}
	}
}

// GQA with fewer KV heads than one side's ranks (SGLang replicates each
// head on tp/heads consecutive ranks), through both daemons: every rank
// of each side opens the room as its scheduler does (expected_senders is
// the prefill TP size, as SGLang's decode knows it), every prefill rank
// sends (a replica that feeds nobody too), and the room is Success on
// both sides with every decode rank holding exactly its heads, on both
// data transports (tcp: the sender's gather and the receiver's scatter).
func TestGQAWithReplicatedHeadsMovesEveryHeadToEveryReplica(t *testing.T) {
	for _, kind := range dataTransports {
		t.Run(string(kind), func(t *testing.T) { gqaMovesEveryHeadToEveryReplica(t, kind) })
	}
}

func gqaMovesEveryHeadToEveryReplica(t *testing.T, kind transfer.Kind) {
	for _, s := range []gqaShape{
		{2, 2, 4}, {1, 1, 2}, {2, 1, 4}, {4, 2, 8},
		{2, 4, 2}, {1, 2, 1}, {2, 4, 1}, {4, 8, 2},
	} {
		t.Run(fmt.Sprintf("%dheads_%d->%d", s.heads, s.pre, s.dec), func(t *testing.T) {
			p := startMappedPairWith(t, s.pre, s.dec, s.layout, onTransport(kind))
			src := func(r int) []int32 { return []int32{int32(3 + r), 20, int32(30 + r)} }
			dst := func(r int) []int32 { return []int32{int32(50 + r), 9, int32(40 - r)} }
			s.fill(p, src)
			const room = 71
			p.moveRoom(t, room, src, dst)
			s.check(t, p, dst)
		})
	}
}

// A data stream decoded does not expect (the shape of a room whose streams
// the two daemons planned apart) is answered fenced and counted in
// pdlink_data_refused_total{reason="unknown_room"} on decode; prefill
// exports the series at zero.
func TestUnexpectedDataStreamIsCountedByReasonOnDecode(t *testing.T) {
	addrs := make(chan string, 1)
	dataListenHook = func(addr string) { addrs <- addr }
	t.Cleanup(func() { dataListenHook = nil })
	p := startPair(t)
	dataAddr := <-addrs
	reg := newRegionWithLayout(t, transfer.UniformLayout(1, 8, 256, 1, 16))
	if _, err := p.decode.RegisterRegion(ctxT(t), &pb.DecodeServiceRegisterRegionRequest{RegionPath: reg.path, Layout: layoutPB(reg.layout)}); err != nil {
		t.Fatal(err)
	}
	series := `pdlink_data_refused_total{reason="unknown_room",side="%s"}`
	if got := metric(t, p.decHTTP, fmt.Sprintf(series, "decode")); got != "0" {
		t.Fatalf("decode unknown_room before any stream: %s", got)
	}
	c, err := net.DialTimeout("tcp", dataAddr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var frame [transfer.HeaderSize]byte
	(&transfer.Header{Type: transfer.FrameDone, Flags: transfer.FlagPayloadCRC, Room: 77, Nonce: 5, Rank: transfer.Rank{TP: 0, Size: 1}}).Encode(frame[:])
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(frame[:]); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, frame[:]); err != nil { // the result: counted before it is written
		t.Fatal(err)
	}
	if h, err := transfer.DecodeHeader(frame[:]); err != nil || h.Type != transfer.FrameResult || h.Status == 0 {
		t.Fatalf("answer %+v (%v), want a result that is not ok", h, err)
	}
	if got := metric(t, p.decHTTP, fmt.Sprintf(series, "decode")); got != "1" {
		t.Fatalf("decode unknown_room after one unexpected stream: %s, want 1", got)
	}
	if got := metric(t, p.preHTTP, fmt.Sprintf(series, "prefill")); got != "0" {
		t.Fatalf("prefill unknown_room: %s, want 0", got)
	}
}
