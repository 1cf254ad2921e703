package service

import (
	"context"
	"fmt"
	"testing"
	"time"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/rankmap"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// benchMHALayout is a model of 8 KV heads of 256 bytes in 64-token pages
// (128 KiB of KV per page and buffer over all ranks), 2 buffers of 256 pages.
func benchMHALayout(rank transfer.Rank) transfer.Layout {
	rankHeads := max(8/int(rank.Size), 1)
	l := transfer.UniformLayout(2, 256, int64(64*rankHeads*256), 8, 64)
	l.Rank = rank
	return l.WithHeads(rankmap.MHA, 64, 8, 256)
}

// BenchmarkMHARoomsThroughTheDaemons moves rooms of 64 pages per buffer (16
// MiB of the model's KV per room, summed over ranks) through both daemons
// over loopback, one room at a time, every rank opening, sending metadata
// and Sending as its scheduler would: equal TP 2 -> 2 (whole pages) beside
// MHA 2 -> 4 (the sender gathers head slices) and 4 -> 2 (the receiver
// scatters them). MB/s is the model's KV bytes per second of room time,
// from OpenSender to Success on both sides.
func BenchmarkMHARoomsThroughTheDaemons(b *testing.B) {
	for _, tc := range []struct{ pre, dec int }{{2, 2}, {2, 4}, {4, 2}} {
		b.Run(fmt.Sprintf("%d->%d", tc.pre, tc.dec), func(b *testing.B) {
			p := startMappedPairWith(b, tc.pre, tc.dec, benchMHALayout, nil)
			const pages = 64
			page := func(i int) []int32 {
				out := make([]int32, pages)
				for k := range out {
					out[k] = int32((i*pages + k) % 256)
				}
				return out
			}
			b.SetBytes(2 * pages * 8 * 256 * 64)
			b.ResetTimer()
			for i := range b.N {
				room := uint64(1000 + i)
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				must := func(_ any, err error) {
					if err != nil {
						cancel()
						b.Fatal(err)
					}
				}
				for r := range tc.pre {
					must(p.prefill.OpenSender(ctx, &pb.OpenSenderRequest{RoomId: room, Rank: tpRank(r, tc.pre)}))
				}
				for r := range tc.dec {
					must(p.decode.OpenReceiver(ctx, &pb.OpenReceiverRequest{RoomId: room, PrefillBootstrapAddr: p.bootstrap,
						ExpectedSenders: uint32(tc.pre), Rank: tpRank(r, tc.dec)}))
					must(p.decode.SendMetadata(ctx, &pb.SendMetadataRequest{RoomId: room, Rank: tpRank(r, tc.dec),
						DstPages: &pb.PageList{Indices: page(i + 1)}, AuxIndex: uint32(r)}))
				}
				waitBench(ctx, b, func() bool {
					pr, err := p.prefill.Poll(ctx, &pb.PrefillServicePollRequest{RoomIds: []uint64{room}})
					return err == nil && pr.Statuses[0].State == pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT
				})
				for r := range tc.pre {
					must(p.prefill.Send(ctx, &pb.SendRequest{RoomId: room, Rank: tpRank(r, tc.pre), Pages: &pb.PageList{Indices: page(i)},
						Last: true, AuxIndex: uint32(r)}))
				}
				waitBench(ctx, b, func() bool {
					pr, err := p.prefill.Poll(ctx, &pb.PrefillServicePollRequest{RoomIds: []uint64{room}})
					if err != nil || pr.Statuses[0].State != pb.RoomState_ROOM_STATE_SUCCESS {
						return false
					}
					dr, err := p.decode.Poll(ctx, &pb.DecodeServicePollRequest{RoomIds: []uint64{room}})
					return err == nil && dr.Statuses[0].State == pb.RoomState_ROOM_STATE_SUCCESS
				})
				must(p.prefill.Clear(ctx, &pb.PrefillServiceClearRequest{RoomIds: []uint64{room}}))
				must(p.decode.Clear(ctx, &pb.DecodeServiceClearRequest{RoomIds: []uint64{room}}))
				cancel()
			}
		})
	}
}

// waitBench polls cond until it holds or ctx ends (then the benchmark fails).
func waitBench(ctx context.Context, b *testing.B, cond func() bool) {
	b.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			b.Fatalf("room did not settle: %v", ctx.Err())
		case <-time.After(200 * time.Microsecond):
		}
	}
}
