package service

import (
	"encoding/json"
	"os"
	"testing"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/transfer"
)

type region struct {
	path   string
	layout transfer.Layout
	mem    *transfer.Region
}

func newRegion(t testing.TB) region {
	t.Helper()
	return newRegionWithLayout(t, transfer.UniformLayout(4, 64, 4096, 8, 64))
}

// newRegionWithLayout creates and maps a region file of layout l, removed
// when the test ends.
func newRegionWithLayout(t testing.TB, l transfer.Layout) region {
	t.Helper()
	path, err := transfer.CreateRegionFile(t.TempDir(), l)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := transfer.OpenRegion(path, l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close(); os.Remove(path) })
	return region{path, l, mem}
}

func layoutPB(l transfer.Layout) *pb.RegionLayout {
	out := &pb.RegionLayout{Rank: &pb.Rank{TpRank: 0, TpSize: 1}, Attention: pb.Attention(l.Attention),
		Aux: &pb.AuxSpec{Offset: uint64(l.Aux.Offset), RowLen: uint32(l.Aux.RowLen), Rows: uint32(l.Aux.Rows)}}
	for _, b := range l.Buffers {
		out.Buffers = append(out.Buffers, &pb.BufferSpec{Offset: uint64(b.Offset), Length: uint64(b.Length), ItemLen: uint32(b.ItemLen),
			PageTokens: uint32(b.PageTokens), TotalHeads: uint32(b.TotalHeads), RankHeads: uint32(b.RankHeads), HeadBytes: uint32(b.HeadBytes)})
	}
	return out
}

func registerRegions(t testing.TB, p *pair) (pre, dec region) {
	t.Helper()
	pre, dec = newRegion(t), newRegion(t)
	if _, err := p.prefill.RegisterRegion(ctxT(t), &pb.PrefillServiceRegisterRegionRequest{RegionPath: pre.path, Layout: layoutPB(pre.layout)}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.decode.RegisterRegion(ctxT(t), &pb.DecodeServiceRegisterRegionRequest{RegionPath: dec.path, Layout: layoutPB(dec.layout)}); err != nil {
		t.Fatal(err)
	}
	return pre, dec
}

func pollState(t *testing.T, p *pair, room uint64) (pre, dec *pb.RoomStatus) {
	t.Helper()
	pr, err := p.prefill.Poll(ctxT(t), &pb.PrefillServicePollRequest{RoomIds: []uint64{room}})
	if err != nil {
		t.Fatal(err)
	}
	dr, err := p.decode.Poll(ctxT(t), &pb.DecodeServicePollRequest{RoomIds: []uint64{room}})
	if err != nil {
		t.Fatal(err)
	}
	return pr.Statuses[0], dr.Statuses[0]
}

type debugRooms struct {
	Rooms []struct {
		Room  uint64 `json:"room"`
		State string `json:"state"`
	} `json:"rooms"`
}

func listDebug(t *testing.T, base string) debugRooms {
	t.Helper()
	var d debugRooms
	if err := json.Unmarshal([]byte(httpGet(t, base+"/debug/rooms")), &d); err != nil {
		t.Fatal(err)
	}
	return d
}

// A room goes from open to Success on both sides with real bytes, shows in
// metrics and /debug/rooms while inflight, and disappears after Clear.
func TestRoomMovesRealBytesAndIsVisibleOnlyWhileHeld(t *testing.T) {
	p := startPair(t)
	pre, dec := registerRegions(t, p)
	const room = 42
	src := []int32{3, 4, 5, 10, 11}
	dst := []int32{60, 61, 7, 8, 9}
	for b := range pre.layout.Buffers {
		for i, pg := range src {
			page := pre.mem.Pages(b, transfer.Run{Start: pg, Count: 1})
			for j := range page {
				page[j] = byte(b*31 + i*7 + j)
			}
		}
	}
	copy(pre.mem.AuxRow(2), []byte("first-token:1234"))

	if _, err := p.prefill.OpenSender(ctxT(t), &pb.OpenSenderRequest{RoomId: room}); err != nil {
		t.Fatal(err)
	}
	ro, err := p.decode.OpenReceiver(ctxT(t), &pb.OpenReceiverRequest{RoomId: room, PrefillBootstrapAddr: p.bootstrap})
	if err != nil {
		t.Fatal(err)
	}
	if ro.Status.Nonce == 0 {
		t.Fatal("decode drew nonce 0")
	}
	if got := metric(t, p.decHTTP, `pdlink_inflight_rooms{side="decode"}`); got != "1" {
		t.Errorf("decode inflight %s while the room is open", got)
	}
	if d := listDebug(t, p.decHTTP); len(d.Rooms) != 1 || d.Rooms[0].Room != room {
		t.Errorf("/debug/rooms on decode: %+v", d)
	}
	if _, err := p.decode.SendMetadata(ctxT(t), &pb.SendMetadataRequest{RoomId: room, DstPages: &pb.PageList{Indices: dst}, AuxIndex: 5}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "prefill WaitingForInput", func() bool {
		ps, _ := pollState(t, p, room)
		return ps.State == pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT
	})
	if _, err := p.prefill.Send(ctxT(t), &pb.SendRequest{RoomId: room, StartPosition: 0, Pages: &pb.PageList{Indices: src[:2]}}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.prefill.Send(ctxT(t), &pb.SendRequest{RoomId: room, StartPosition: 2, Pages: &pb.PageList{Indices: src[2:]}, Last: true, AuxIndex: 2}); err != nil {
		t.Fatal(err)
	}
	waitBothSuccess(t, p, room)
	for b := range dec.layout.Buffers {
		for i, pg := range dst {
			want := pre.mem.Pages(b, transfer.Run{Start: src[i], Count: 1})
			got := dec.mem.Pages(b, transfer.Run{Start: pg, Count: 1})
			if string(got) != string(want) {
				t.Fatalf("buffer %d page %d differs from source page %d", b, pg, src[i])
			}
		}
	}
	if string(dec.mem.AuxRow(5)[:16]) != "first-token:1234" {
		t.Fatalf("aux row not delivered: %q", dec.mem.AuxRow(5)[:16])
	}
	gr, err := p.decAdmin.GetRoom(ctxT(t), &pb.GetRoomRequest{RoomId: room})
	if err != nil || len(gr.Room.History) < 3 {
		t.Fatalf("GetRoom history %v %v", gr, err)
	}
	if got := metric(t, p.decHTTP, `pdlink_transfer_bytes_total{side="decode"}`); got == "0" {
		t.Error("decode counted no transfer bytes")
	}

	for _, c := range []func() error{
		func() error {
			_, err := p.prefill.Clear(ctxT(t), &pb.PrefillServiceClearRequest{RoomIds: []uint64{room}})
			return err
		},
		func() error {
			_, err := p.decode.Clear(ctxT(t), &pb.DecodeServiceClearRequest{RoomIds: []uint64{room}})
			return err
		},
	} {
		if err := c(); err != nil {
			t.Fatal(err)
		}
	}
	ps, ds := pollState(t, p, room)
	if ps.Found || ds.Found {
		t.Fatalf("room still found after Clear: %v %v", ps, ds)
	}
	for _, base := range []string{p.preHTTP, p.decHTTP} {
		if d := listDebug(t, base); len(d.Rooms) != 0 {
			t.Errorf("%s/debug/rooms after Clear: %+v", base, d)
		}
	}
	if got := metric(t, p.decHTTP, `pdlink_rooms{side="decode",state="Success"}`); got != "0" {
		t.Errorf("decode still counts a Success room after Clear: %s", got)
	}
}
