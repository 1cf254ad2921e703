package service

import (
	"testing"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
)

// watchPrefill subscribes to prefill's transitions and returns a function
// that reads them until room reaches to, answering that transition.
func watchPrefill(t *testing.T, p *pair) func(room uint64, to pb.RoomState) *pb.Transition {
	t.Helper()
	stream, err := p.prefill.Watch(ctxT(t), &pb.PrefillServiceWatchRequest{})
	subscribed(t, stream, err)
	return func(room uint64, to pb.RoomState) *pb.Transition {
		t.Helper()
		for {
			ev, err := stream.Recv()
			if err != nil {
				t.Fatalf("watch: %v", err)
			}
			if tr := ev.Event.GetTransition(); tr.GetRoomId() == room && tr.GetTo() == to {
				return tr
			}
		}
	}
}

// decode's prefix_len reaches the prefill scheduler as its room's
// RoomStatus.prefix_len from WaitingForInput on: in the Watch transition
// of that move, in Poll and in Send's answer, so its first Send can start
// at the prefix (and the bytes above it arrive). A room without a prefix
// shows 0, and decode's statuses never carry one.
func TestPrefillStatusShowsDecodesPrefixLen(t *testing.T) {
	p := startQuickPair(t)
	pre, dec := registerRegions(t, p)
	next := watchPrefill(t, p)
	const prefix = 3
	r := bindKV(t, p, pre, dec, 81, []int32{10, 11, 12, 13, 14, 15}, []int32{30, 31, 32, 33, 34, 35}, prefix)
	if tr := next(r.id, pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT); tr.PrefixLen != prefix {
		t.Fatalf("WaitingForInput transition carries prefix_len %d, want %d", tr.PrefixLen, prefix)
	}
	if st := prePoll(t, p, r.id)(); st.PrefixLen != prefix {
		t.Fatalf("prefill Poll: prefix_len %d, want %d", st.PrefixLen, prefix)
	}
	resp, err := p.prefill.Send(ctxT(t), &pb.SendRequest{RoomId: r.id, StartPosition: prefix, Pages: &pb.PageList{Indices: r.src[prefix:]}, Last: true, AuxIndex: 2})
	if err != nil {
		t.Fatalf("Send from the prefix: %v", err)
	}
	if resp.Status.PrefixLen != prefix {
		t.Fatalf("Send answer: prefix_len %d, want %d", resp.Status.PrefixLen, prefix)
	}
	waitBothSuccess(t, p, r.id)
	r.wantOnlyAbovePrefix(t, prefix)
	if st := decPoll(t, p, r.id)(); st.PrefixLen != 0 {
		t.Fatalf("decode Poll: prefix_len %d, want 0 (a prefill field)", st.PrefixLen)
	}

	none := bindKV(t, p, pre, dec, 82, []int32{16, 17}, []int32{36, 37}, 0)
	if tr := next(none.id, pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT); tr.PrefixLen != 0 {
		t.Fatalf("no prefix: WaitingForInput transition carries prefix_len %d", tr.PrefixLen)
	}
	if st := prePoll(t, p, none.id)(); st.PrefixLen != 0 {
		t.Fatalf("no prefix: prefill Poll shows prefix_len %d", st.PrefixLen)
	}
}

// With several decode ranks the room's prefix_len is the fewest positions
// any of them holds (a Send past one rank's prefix would be refused for
// it), 0 until every rank's METADATA is in; a prefill rank that opens the
// room once decode bound it reads it in its Open answer.
func TestPrefillPrefixLenIsTheFewestAnyDecodeRankHolds(t *testing.T) {
	const n, room = 3, 83
	p := startTPPair(t, n)
	src, dst := []int32{3, 4, 5, 6}, []int32{20, 21, 22, 23}
	for i := range n {
		p.fillRank(i, src, int64(i))
	}
	if _, err := p.prefill.OpenSender(ctxT(t), &pb.OpenSenderRequest{RoomId: room, Rank: tpRank(0, n)}); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := p.decode.OpenReceiver(ctxT(t), &pb.OpenReceiverRequest{RoomId: room, PrefillBootstrapAddr: p.bootstrap,
			ExpectedSenders: n, Rank: tpRank(i, n)}); err != nil {
			t.Fatal(err)
		}
	}
	prefixes := []uint32{2, 1, 3} // neither the first, the last nor the most
	sendMetadata := func(i int) {
		t.Helper()
		if _, err := p.decode.SendMetadata(ctxT(t), &pb.SendMetadataRequest{RoomId: room, Rank: tpRank(i, n),
			DstPages: &pb.PageList{Indices: dst}, AuxIndex: uint32(i), PrefixLen: prefixes[i]}); err != nil {
			t.Fatalf("SendMetadata rank %d: %v", i, err)
		}
	}
	sendMetadata(0)
	eventually(t, "decode rank 0's METADATA applied", func() bool {
		info, err := p.preAdmin.GetRoom(ctxT(t), &pb.GetRoomRequest{RoomId: room})
		return err == nil && info.Room.Nonce != 0
	})
	if st := prePoll(t, p.pair, room)(); st.State != pb.RoomState_ROOM_STATE_BOOTSTRAPPING || st.PrefixLen != 0 {
		t.Fatalf("one decode rank of %d in: prefill %v prefix_len %d, want Bootstrapping and 0", n, st.State, st.PrefixLen)
	}
	sendMetadata(1)
	sendMetadata(2)
	st := waitState(t, "prefill WaitingForInput", prePoll(t, p.pair, room), pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT)
	if st.PrefixLen != 1 {
		t.Fatalf("prefill prefix_len %d, want 1 (the fewest of %v)", st.PrefixLen, prefixes)
	}
	joined, err := p.prefill.OpenSender(ctxT(t), &pb.OpenSenderRequest{RoomId: room, Rank: tpRank(1, n)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.prefill.OpenSender(ctxT(t), &pb.OpenSenderRequest{RoomId: room, Rank: tpRank(2, n)}); err != nil {
		t.Fatal(err)
	}
	if joined.Status.State != pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT || joined.Status.PrefixLen != 1 {
		t.Fatalf("a rank joining the bound room: %v prefix_len %d, want WaitingForInput and 1", joined.Status.State, joined.Status.PrefixLen)
	}
	for i := range n {
		if _, err := p.prefill.Send(ctxT(t), &pb.SendRequest{RoomId: room, Rank: tpRank(i, n), StartPosition: st.PrefixLen,
			Pages: &pb.PageList{Indices: src[st.PrefixLen:]}, Last: true, AuxIndex: uint32(i)}); err != nil {
			t.Fatalf("Send rank %d from prefix_len: %v", i, err)
		}
	}
	waitBothSuccess(t, p.pair, room)
	for i := range n {
		for b := range p.dec[i].layout.Buffers {
			for k := int(prefixes[i]); k < len(dst); k++ {
				want := p.pre[i].mem.Pages(b, pageRun(src[k]))
				if got := p.dec[i].mem.Pages(b, pageRun(dst[k])); string(got) != string(want) {
					t.Fatalf("decode rank %d buffer %d position %d differs from its source", i, b, k)
				}
			}
		}
	}
}
