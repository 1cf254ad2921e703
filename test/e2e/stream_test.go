package e2e

import (
	"bytes"
	"context"
	"testing"
	"time"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/internal/testbed"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// TestEachChunkIsOnTheWireBeforeTheLastIsSent runs a room through the real
// daemons as a chunked prefill does: four Sends with a pause after each of
// the first three, each pause lasting until decode has verified that chunk
// (pdlink_transfer_bytes_total on decode counts each verified chunk) and its
// pages are in decode's region, while the room is not done yet on either
// side. The last Send then completes the room.
func TestEachChunkIsOnTheWireBeforeTheLastIsSent(t *testing.T) {
	const chunks, perChunk, item = 4, 16, 64 << 10
	layout := transfer.UniformLayout(2, chunks*perChunk, item, 4, 64)
	p := newOwnerPair(t, layout, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pages := p.allPages()
	for b := range layout.Buffers {
		buf := p.src.Buffer(b)
		for i := range buf {
			buf[i] = byte(i*7 + b*13 + i>>16)
		}
	}
	const room = 77
	p.open(ctx, room)
	p.bind(ctx, room, pages)
	decodeBytes := func() float64 { return metric(t, p.dec.HTTPAddr, `pdlink_transfer_bytes_total{side="decode"}`) }
	landed := func(upTo int) bool {
		for b := range layout.Buffers {
			run := transfer.Run{Start: 0, Count: int32(upTo)}
			if !bytes.Equal(p.dst.Pages(b, run), p.src.Pages(b, run)) {
				return false
			}
		}
		return true
	}
	for c := range chunks {
		last := c == chunks-1
		start := c * perChunk
		req := &pb.SendRequest{RoomId: room, StartPosition: uint32(start), Pages: &pb.PageList{Indices: pages[start : start+perChunk]}, Last: last}
		if _, err := p.prefill.Send(ctx, req); err != nil {
			t.Fatalf("Send of chunk %d: %v", c, err)
		}
		if last {
			break
		}
		want := float64((c + 1) * perChunk * len(layout.Buffers) * item)
		if _, ok := testbed.Eventually(20*time.Second, func() bool { return decodeBytes() >= want && landed(start+perChunk) }); !ok {
			t.Fatalf("after Send %d of %d: decode verified %.0f of %.0f bytes before the last Send", c+1, chunks, decodeBytes(), want)
		}
		for side, get := range map[string]func(uint64) (*pb.RoomStatus, error){"prefill": p.prefillStatus, "decode": p.decodeStatus} {
			if st, err := get(room); err != nil || st.GetState() == pb.RoomState_ROOM_STATE_SUCCESS || st.GetState() == pb.RoomState_ROOM_STATE_FAILED {
				t.Fatalf("%s after Send %d of %d: %v %v, want the room still transferring", side, c+1, chunks, st, err)
			}
		}
	}
	p.waitDecode(room, 20*time.Second, "decode Success", isState(pb.RoomState_ROOM_STATE_SUCCESS))
	p.waitPrefill(room, 20*time.Second, "prefill Success", isState(pb.RoomState_ROOM_STATE_SUCCESS))
	if !landed(chunks * perChunk) {
		t.Fatal("decode's region differs from prefill's after Success")
	}
}
