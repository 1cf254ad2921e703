package service

import (
	"bytes"
	"testing"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// TestEachSendsPagesReachDecodeBeforeTheLastSend: a Send that is not the
// last puts its pages on the wire at once: decode's region holds them while
// the room is still waiting for its last Send, which then completes it.
func TestEachSendsPagesReachDecodeBeforeTheLastSend(t *testing.T) {
	p := startPair(t)
	pre, dec := registerRegions(t, p)
	const room = 43
	src := []int32{3, 4, 5, 10, 11}
	dst := []int32{60, 61, 7, 8, 9}
	for b := range pre.layout.Buffers {
		for i, pg := range src {
			page := pre.mem.Pages(b, transfer.Run{Start: pg, Count: 1})
			for j := range page {
				page[j] = byte(b*29 + i*5 + j + 1)
			}
		}
	}
	if _, err := p.prefill.OpenSender(ctxT(t), &pb.OpenSenderRequest{RoomId: room}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.decode.OpenReceiver(ctxT(t), &pb.OpenReceiverRequest{RoomId: room, PrefillBootstrapAddr: p.bootstrap}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.decode.SendMetadata(ctxT(t), &pb.SendMetadataRequest{RoomId: room, DstPages: &pb.PageList{Indices: dst}, AuxIndex: 5}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "prefill WaitingForInput", func() bool {
		ps, _ := pollState(t, p, room)
		return ps.State == pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT
	})
	landed := func(i int) bool {
		for b := range dec.layout.Buffers {
			want := pre.mem.Pages(b, transfer.Run{Start: src[i], Count: 1})
			if !bytes.Equal(dec.mem.Pages(b, transfer.Run{Start: dst[i], Count: 1}), want) {
				return false
			}
		}
		return true
	}
	if _, err := p.prefill.Send(ctxT(t), &pb.SendRequest{RoomId: room, StartPosition: 0, Pages: &pb.PageList{Indices: src[:2]}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the first Send's pages in decode's region before the last Send", func() bool { return landed(0) && landed(1) })
	if ps, ds := pollState(t, p, room); ps.State == pb.RoomState_ROOM_STATE_SUCCESS || ds.State == pb.RoomState_ROOM_STATE_SUCCESS {
		t.Fatalf("room done before its last Send: prefill %v, decode %v", ps.State, ds.State)
	}
	if _, err := p.prefill.Send(ctxT(t), &pb.SendRequest{RoomId: room, StartPosition: 2, Pages: &pb.PageList{Indices: src[2:]}, Last: true, AuxIndex: 2}); err != nil {
		t.Fatal(err)
	}
	waitBothSuccess(t, p, room)
	for i := range src {
		if !landed(i) {
			t.Fatalf("position %d differs", i)
		}
	}
}
