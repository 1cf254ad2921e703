package service

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/internal/daemon"
	"github.com/pdlink/pdlink/pkg/transfer"
)

func pageRun(pg int32) transfer.Run { return transfer.Run{Start: pg, Count: 1} }

// wantCode fails unless err has code c and its message holds every word.
func wantCode(t *testing.T, err error, c codes.Code, words ...string) {
	t.Helper()
	if status.Code(err) != c {
		t.Fatalf("got %v, want %v", err, c)
	}
	for _, w := range words {
		if !strings.Contains(status.Convert(err).Message(), w) {
			t.Fatalf("%v does not say %q", err, w)
		}
	}
}

// wantRoomFailedInfo checks err carries the ROOM_FAILED ErrorInfo with the
// room's reasons, for clients that read errors programmatically.
func wantRoomFailedInfo(t *testing.T, err error, reason, peerReason string) {
	t.Helper()
	for _, d := range status.Convert(err).Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.Reason == "ROOM_FAILED" {
			if ei.Metadata["reason"] != reason || ei.Metadata["peer_reason"] != peerReason {
				t.Fatalf("ErrorInfo metadata %v, want reason %q peer_reason %q", ei.Metadata, reason, peerReason)
			}
			return
		}
	}
	t.Fatalf("%v has no ROOM_FAILED ErrorInfo", err)
}

// startQuickPair is startPair with a short drain: these tests leave live
// rooms behind, and waiting out the default drain on each would only slow
// them down.
func startQuickPair(t *testing.T) *pair {
	return startPairWith(t, func(pre, dec *daemon.Config) {
		pre.DrainTimeout, dec.DrainTimeout = 100*time.Millisecond, 100*time.Millisecond
	})
}

// openBoth opens room on both daemons and returns decode's nonce.
func openBoth(t *testing.T, p *pair, room uint64) uint64 {
	t.Helper()
	if _, err := p.prefill.OpenSender(ctxT(t), &pb.OpenSenderRequest{RoomId: room}); err != nil {
		t.Fatal(err)
	}
	ro, err := p.decode.OpenReceiver(ctxT(t), &pb.OpenReceiverRequest{RoomId: room, PrefillBootstrapAddr: p.bootstrap})
	if err != nil {
		t.Fatal(err)
	}
	return ro.Status.Nonce
}

func waitState(t *testing.T, what string, poll func() *pb.RoomStatus, want pb.RoomState) *pb.RoomStatus {
	t.Helper()
	var st *pb.RoomStatus
	eventually(t, what, func() bool {
		st = poll()
		if want == pb.RoomState_ROOM_STATE_SUCCESS && st.State == pb.RoomState_ROOM_STATE_FAILED {
			t.Fatalf("%s: room Failed instead: %s", what, statusLine(st)) // terminal (I1): the wait could only run out
		}
		return st.State == want
	})
	return st
}

func prePoll(t *testing.T, p *pair, room uint64) func() *pb.RoomStatus {
	return func() *pb.RoomStatus { s, _ := pollState(t, p, room); return s }
}

func decPoll(t *testing.T, p *pair, room uint64) func() *pb.RoomStatus {
	return func() *pb.RoomStatus { _, s := pollState(t, p, room); return s }
}

func TestSendOnRoomNeverOpenedIsNotFound(t *testing.T) {
	p := startQuickPair(t)
	registerRegions(t, p)
	for _, last := range []bool{false, true} {
		_, err := p.prefill.Send(ctxT(t), &pb.SendRequest{RoomId: 31337, Pages: &pb.PageList{Indices: []int32{0}}, Last: last})
		wantCode(t, err, codes.NotFound, "31337", "OpenSender")
	}
	// Still FailedPrecondition for a room that is open but not bound yet.
	if _, err := p.prefill.OpenSender(ctxT(t), &pb.OpenSenderRequest{RoomId: 5}); err != nil {
		t.Fatal(err)
	}
	_, err := p.prefill.Send(ctxT(t), &pb.SendRequest{RoomId: 5, Pages: &pb.PageList{Indices: []int32{0}}})
	wantCode(t, err, codes.FailedPrecondition, "Bootstrapping")
}

func TestSendOnFailedRoomNamesStateAndReason(t *testing.T) {
	p := startQuickPair(t)
	registerRegions(t, p)
	const room = 11
	openBoth(t, p, room)
	if _, err := p.decode.SendMetadata(ctxT(t), &pb.SendMetadataRequest{RoomId: room, DstPages: &pb.PageList{Indices: []int32{1, 2}}}); err != nil {
		t.Fatal(err)
	}
	waitState(t, "prefill WaitingForInput", prePoll(t, p, room), pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT)
	// Decode's scheduler gives up: prefill's room fails because its peer
	// said so, with decode's reason kept as the peer reason.
	if _, err := p.decode.Abort(ctxT(t), &pb.DecodeServiceAbortRequest{RoomId: room}); err != nil {
		t.Fatal(err)
	}
	st := waitState(t, "prefill Failed", prePoll(t, p, room), pb.RoomState_ROOM_STATE_FAILED)
	if st.Reason != "aborted:remote" || st.PeerReason != "aborted:local" {
		t.Fatalf("prefill Poll reason %q peer_reason %q, want aborted:remote and decode's aborted:local", st.Reason, st.PeerReason)
	}
	for _, last := range []bool{false, true} {
		_, err := p.prefill.Send(ctxT(t), &pb.SendRequest{RoomId: room, Pages: &pb.PageList{Indices: []int32{3, 4}}, Last: last})
		wantCode(t, err, codes.FailedPrecondition, "Failed", "aborted:remote", "aborted:local")
		wantRoomFailedInfo(t, err, "aborted:remote", "aborted:local")
	}
	// A room that failed before decode's metadata bound it: the same answer.
	if _, err := p.prefill.OpenSender(ctxT(t), &pb.OpenSenderRequest{RoomId: room + 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.prefill.Abort(ctxT(t), &pb.PrefillServiceAbortRequest{RoomId: room + 1}); err != nil {
		t.Fatal(err)
	}
	waitState(t, "prefill Failed", prePoll(t, p, room+1), pb.RoomState_ROOM_STATE_FAILED)
	_, err := p.prefill.Send(ctxT(t), &pb.SendRequest{RoomId: room + 1, Pages: &pb.PageList{Indices: []int32{3}}})
	wantCode(t, err, codes.FailedPrecondition, "Failed", "aborted:local")
	wantRoomFailedInfo(t, err, "aborted:local", "")
}

func TestSendMetadataRetriedWithSameContentIsIdempotent(t *testing.T) {
	p := startQuickPair(t)
	registerRegions(t, p)
	const room = 21
	nonce := openBoth(t, p, room)
	md := &pb.SendMetadataRequest{RoomId: room, DstPages: &pb.PageList{Indices: []int32{60, 61, 7}}, AuxIndex: 3}
	if _, err := p.decode.SendMetadata(ctxT(t), md); err != nil {
		t.Fatal(err)
	}
	// The client timed out and retries: same request, same answer. The
	// same pages written as runs are the same request too.
	retry := &pb.SendMetadataRequest{RoomId: room, DstPages: &pb.PageList{Runs: []*pb.PageRun{{Start: 60, Count: 2}, {Start: 7, Count: 1}}}, AuxIndex: 3,
		Rank: &pb.Rank{TpRank: 0, TpSize: 1}}
	for i, r := range []*pb.SendMetadataRequest{md, retry} {
		resp, err := p.decode.SendMetadata(ctxT(t), r)
		if err != nil {
			t.Fatalf("retry %d: %v", i, err)
		}
		if resp.Status.Nonce != nonce || resp.Status.State == pb.RoomState_ROOM_STATE_FAILED {
			t.Fatalf("retry %d answered %v", i, resp.Status)
		}
	}
	// After the room moved on, a retry is still the same request.
	waitState(t, "prefill WaitingForInput", prePoll(t, p, room), pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT)
	if _, err := p.prefill.Send(ctxT(t), &pb.SendRequest{RoomId: room, Pages: &pb.PageList{Indices: []int32{1, 2, 3}}, Last: true, AuxIndex: 1}); err != nil {
		t.Fatal(err)
	}
	waitState(t, "decode Success", decPoll(t, p, room), pb.RoomState_ROOM_STATE_SUCCESS)
	resp, err := p.decode.SendMetadata(ctxT(t), md)
	if err != nil || resp.Status.State != pb.RoomState_ROOM_STATE_SUCCESS {
		t.Fatalf("retry after Success: %v %v, want OK with Success", resp, err)
	}
}

func TestSendMetadataWithOtherContentIsRefusedAndNotApplied(t *testing.T) {
	p := startQuickPair(t)
	pre, dec := registerRegions(t, p)
	const room = 22
	openBoth(t, p, room)
	first := &pb.SendMetadataRequest{RoomId: room, DstPages: &pb.PageList{Indices: []int32{60, 61}}, AuxIndex: 3}
	if _, err := p.decode.SendMetadata(ctxT(t), first); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		field string
		req   *pb.SendMetadataRequest
	}{
		{"dst_pages", &pb.SendMetadataRequest{RoomId: room, DstPages: &pb.PageList{Indices: []int32{60, 62}}, AuxIndex: 3}},
		{"dst_pages", &pb.SendMetadataRequest{RoomId: room, DstPages: &pb.PageList{Indices: []int32{61, 60}}, AuxIndex: 3}},
		{"aux_index", &pb.SendMetadataRequest{RoomId: room, DstPages: &pb.PageList{Indices: []int32{60, 61}}, AuxIndex: 4}},
	} {
		_, err := p.decode.SendMetadata(ctxT(t), c.req)
		wantCode(t, err, codes.AlreadyExists, c.field)
	}
	// The first metadata is the one that holds: the bytes land in its pages.
	waitState(t, "prefill WaitingForInput", prePoll(t, p, room), pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT)
	for b := range pre.layout.Buffers {
		for _, pg := range []int32{1, 2} {
			page := pre.mem.Pages(b, pageRun(pg))
			for j := range page {
				page[j] = byte(int(pg)*13 + b + j)
			}
		}
	}
	if _, err := p.prefill.Send(ctxT(t), &pb.SendRequest{RoomId: room, Pages: &pb.PageList{Indices: []int32{1, 2}}, Last: true, AuxIndex: 0}); err != nil {
		t.Fatal(err)
	}
	waitState(t, "decode Success", decPoll(t, p, room), pb.RoomState_ROOM_STATE_SUCCESS)
	for b := range dec.layout.Buffers {
		for i, pg := range []int32{60, 61} {
			if string(dec.mem.Pages(b, pageRun(pg))) != string(pre.mem.Pages(b, pageRun(int32(i+1)))) {
				t.Fatalf("buffer %d page %d is not the first metadata's destination", b, pg)
			}
		}
	}
}

func TestSendMetadataOnFailedRoomNamesStateAndReason(t *testing.T) {
	p := startQuickPair(t)
	registerRegions(t, p)
	const room = 23
	openBoth(t, p, room)
	md := &pb.SendMetadataRequest{RoomId: room, DstPages: &pb.PageList{Indices: []int32{1}}}
	if _, err := p.decode.Abort(ctxT(t), &pb.DecodeServiceAbortRequest{RoomId: room}); err != nil {
		t.Fatal(err)
	}
	waitState(t, "decode Failed", decPoll(t, p, room), pb.RoomState_ROOM_STATE_FAILED)
	_, err := p.decode.SendMetadata(ctxT(t), md)
	wantCode(t, err, codes.FailedPrecondition, "Failed", "aborted:local")
	wantRoomFailedInfo(t, err, "aborted:local", "")

	// A retry of metadata that was sent before the room failed: the same.
	const room2 = 24
	openBoth(t, p, room2)
	md.RoomId = room2
	if _, err := p.decode.SendMetadata(ctxT(t), md); err != nil {
		t.Fatal(err)
	}
	if _, err := p.decode.Abort(ctxT(t), &pb.DecodeServiceAbortRequest{RoomId: room2}); err != nil {
		t.Fatal(err)
	}
	waitState(t, "decode Failed", decPoll(t, p, room2), pb.RoomState_ROOM_STATE_FAILED)
	_, err = p.decode.SendMetadata(ctxT(t), md)
	wantCode(t, err, codes.FailedPrecondition, "Failed", "aborted:local")
}

// A rank the daemon holds no region for is refused at the call, before
// anything is sent or recorded: the room is untouched and still usable.
func TestRankWithoutRegionIsInvalidArgument(t *testing.T) {
	p := startQuickPair(t)
	registerRegions(t, p)
	const room = 41
	openBoth(t, p, room)
	for _, rk := range []*pb.Rank{{TpRank: 1, TpSize: 2}, {TpRank: 0, TpSize: 2}} {
		t.Run(fmt.Sprintf("metadata rank %d of %d", rk.TpRank, rk.TpSize), func(t *testing.T) {
			_, err := p.decode.SendMetadata(ctxT(t), &pb.SendMetadataRequest{RoomId: room, Rank: rk, DstPages: &pb.PageList{Indices: []int32{1}}})
			wantField(t, err, "rank")
		})
	}
	if _, ds := pollState(t, p, room); ds.State != pb.RoomState_ROOM_STATE_BOOTSTRAPPING {
		t.Fatalf("decode room after refused metadata: %v", ds)
	}
	if _, err := p.decode.SendMetadata(ctxT(t), &pb.SendMetadataRequest{RoomId: room, Rank: &pb.Rank{TpRank: 0, TpSize: 1}, DstPages: &pb.PageList{Indices: []int32{1, 2}}}); err != nil {
		t.Fatal(err)
	}
	waitState(t, "prefill WaitingForInput", prePoll(t, p, room), pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT)
	for _, rk := range []*pb.Rank{{TpRank: 1, TpSize: 2}, {TpRank: 0, TpSize: 2}} {
		for _, last := range []bool{false, true} {
			t.Run(fmt.Sprintf("send rank %d of %d last %v", rk.TpRank, rk.TpSize, last), func(t *testing.T) {
				_, err := p.prefill.Send(ctxT(t), &pb.SendRequest{RoomId: room, Rank: rk, Pages: &pb.PageList{Indices: []int32{3, 4}}, Last: last})
				wantField(t, err, "rank")
			})
		}
	}
	// Nothing was taken: the room still starts at position 0 and succeeds.
	if _, err := p.prefill.Send(ctxT(t), &pb.SendRequest{RoomId: room, Pages: &pb.PageList{Indices: []int32{3, 4}}, Last: true}); err != nil {
		t.Fatal(err)
	}
	waitState(t, "decode Success", decPoll(t, p, room), pb.RoomState_ROOM_STATE_SUCCESS)
}

func TestOpenReceiverRefusesAnAddressItCannotDial(t *testing.T) {
	p := startQuickPair(t)
	registerRegions(t, p)
	for _, addr := range []string{
		"tcp://127.0.0.1:99999", "tcp://127.0.0.1:0", "tcp://127.0.0.1:65536", "tcp://127.0.0.1:-1",
		"tcp://127.0.0.1", "tcp://:5555", "tcp://*:5555", "127.0.0.1:5555", "udp://127.0.0.1:5555",
		"tcp://127.0.0.1:5555/x", "tcp://u@127.0.0.1:5555", "tcp://127.0.0.1:5555?x=1", "tcp://127.0.0.1:http", "",
	} {
		t.Run(addr, func(t *testing.T) {
			_, err := p.decode.OpenReceiver(ctxT(t), &pb.OpenReceiverRequest{RoomId: 51, PrefillBootstrapAddr: addr})
			wantField(t, err, "prefill_bootstrap_addr")
		})
	}
	lr, err := p.decAdmin.ListRooms(ctxT(t), &pb.ListRoomsRequest{})
	if err != nil || len(lr.Rooms) != 0 {
		t.Fatalf("decode rooms after refused opens: %v %v", lr, err)
	}
}

func TestBootstrapAddrValidation(t *testing.T) {
	for _, ok := range []string{"tcp://127.0.0.1:1", "tcp://127.0.0.1:65535", "tcp://[::1]:5555", "tcp://localhost:5555"} {
		if err := checkBootstrapAddr("addr", ok); err != nil {
			t.Errorf("%s refused: %v", ok, err)
		}
	}
	wantField(t, checkBootstrapAddr("addr", "tcp://[::1]:70000"), "addr")
}

// Poll shows the room's nonce in every state, not only once Failed.
func TestPollCarriesTheNonceInEveryState(t *testing.T) {
	p := startQuickPair(t)
	registerRegions(t, p)
	const room = 61
	nonce := openBoth(t, p, room)
	ps, ds := pollState(t, p, room)
	if ds.State != pb.RoomState_ROOM_STATE_BOOTSTRAPPING || ds.Nonce != nonce {
		t.Fatalf("decode Poll in Bootstrapping: %v, want nonce %d", ds, nonce)
	}
	if ps.Nonce != 0 {
		t.Fatalf("prefill room is unbound yet Poll says nonce %d", ps.Nonce)
	}
	if _, err := p.decode.SendMetadata(ctxT(t), &pb.SendMetadataRequest{RoomId: room, DstPages: &pb.PageList{Indices: []int32{1}}}); err != nil {
		t.Fatal(err)
	}
	ps = waitState(t, "prefill WaitingForInput", prePoll(t, p, room), pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT)
	if ps.Nonce != nonce {
		t.Fatalf("prefill Poll after METADATA: nonce %d, want decode's %d", ps.Nonce, nonce)
	}
	// The prefill scheduler that was told the nonce sees it from the start.
	if _, err := p.prefill.OpenSender(ctxT(t), &pb.OpenSenderRequest{RoomId: room + 1, Nonce: 77}); err != nil {
		t.Fatal(err)
	}
	if ps, _ := pollState(t, p, room+1); ps.Nonce != 77 {
		t.Fatalf("prefill Poll of a room opened with nonce 77: %v", ps)
	}
}

// The loser of a room id collision sees why: aborted:remote with the peer
// reason collision in Poll, Watch and GetRoom, and both daemons count the
// collision (prefill detected it, decode was told).
func TestCollisionLoserSeesPeerReasonAndBothDaemonsCountIt(t *testing.T) {
	p := startQuickPair(t)
	registerRegions(t, p)
	const room = 71
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := p.decode.Watch(ctx, &pb.DecodeServiceWatchRequest{Filter: &pb.WatchFilter{ToStates: []pb.RoomState{pb.RoomState_ROOM_STATE_FAILED}}})
	subscribed(t, stream, err)
	// Prefill's room for this id belongs to another request (nonce 12345).
	if _, err := p.prefill.OpenSender(ctxT(t), &pb.OpenSenderRequest{RoomId: room, Nonce: 12345}); err != nil {
		t.Fatal(err)
	}
	ro, err := p.decode.OpenReceiver(ctxT(t), &pb.OpenReceiverRequest{RoomId: room, PrefillBootstrapAddr: p.bootstrap})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.decode.SendMetadata(ctxT(t), &pb.SendMetadataRequest{RoomId: room, DstPages: &pb.PageList{Indices: []int32{1}}}); err != nil {
		t.Fatal(err)
	}
	ds := waitState(t, "decode Failed", decPoll(t, p, room), pb.RoomState_ROOM_STATE_FAILED)
	if ds.Reason != "aborted:remote" || ds.PeerReason != "collision" || ds.Nonce != ro.Status.Nonce {
		t.Fatalf("decode Poll %v, want aborted:remote, peer_reason collision, nonce %d", ds, ro.Status.Nonce)
	}
	ev, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if tr := ev.Event.GetTransition(); tr.GetRoomId() != room || tr.GetReason() != "aborted:remote" || tr.GetPeerReason() != "collision" {
		t.Fatalf("Watch event %v, want room %d Failed(aborted:remote, peer collision)", ev, room)
	}
	gr, err := p.decAdmin.GetRoom(ctxT(t), &pb.GetRoomRequest{RoomId: room})
	if err != nil || gr.Room.PeerReason != "collision" {
		t.Fatalf("GetRoom %v %v, want peer_reason collision", gr, err)
	}
	if h := gr.Room.History; len(h) == 0 || h[len(h)-1].To != pb.RoomState_ROOM_STATE_FAILED || h[len(h)-1].PeerReason != "collision" {
		t.Fatalf("GetRoom history %v, want the move to Failed with peer_reason collision", h)
	}
	lr, err := p.decAdmin.ListRooms(ctxT(t), &pb.ListRoomsRequest{})
	if err != nil || len(lr.Rooms) != 1 || lr.Rooms[0].PeerReason != "collision" {
		t.Fatalf("ListRooms %v %v, want the room with peer_reason collision", lr, err)
	}
	// The winner is untouched.
	if ps, _ := pollState(t, p, room); ps.State != pb.RoomState_ROOM_STATE_BOOTSTRAPPING || ps.Nonce != 12345 {
		t.Fatalf("prefill's room of the other request: %v", ps)
	}
	for side, base := range map[string]string{"prefill": p.preHTTP, "decode": p.decHTTP} {
		if got := metric(t, base, fmt.Sprintf(`pdlink_room_collisions_total{side=%q}`, side)); got != "1" {
			t.Errorf("%s pdlink_room_collisions_total %s, want 1", side, got)
		}
	}
}

// When prefill times a room out, decode's scheduler learns the cause.
func TestPeerTimeoutReachesTheSchedulerAsPeerReason(t *testing.T) {
	p := startPairWith(t, func(pre, dec *daemon.Config) {
		pre.WaitingTimeout = 300 * time.Millisecond
		pre.DrainTimeout, dec.DrainTimeout = 100*time.Millisecond, 100*time.Millisecond
	})
	registerRegions(t, p)
	const room = 81
	openBoth(t, p, room)
	if _, err := p.decode.SendMetadata(ctxT(t), &pb.SendMetadataRequest{RoomId: room, DstPages: &pb.PageList{Indices: []int32{1}}}); err != nil {
		t.Fatal(err)
	}
	ds := waitState(t, "decode Failed", decPoll(t, p, room), pb.RoomState_ROOM_STATE_FAILED)
	if ds.Reason != "aborted:remote" || ds.PeerReason != "timeout:waiting_for_input" {
		t.Fatalf("decode Poll %v, want aborted:remote with peer_reason timeout:waiting_for_input", ds)
	}
}

// Retries that overlap the first call (a client that gave up early) are
// one request: every call answers OK and the room is bound once.
func TestConcurrentSendMetadataRetriesAreOneRequest(t *testing.T) {
	p := startQuickPair(t)
	registerRegions(t, p)
	const room = 25
	openBoth(t, p, room)
	md := &pb.SendMetadataRequest{RoomId: room, DstPages: &pb.PageList{Indices: []int32{9, 10}}, AuxIndex: 1}
	errs := make(chan error, 8)
	for range cap(errs) {
		go func() {
			_, err := p.decode.SendMetadata(ctxT(t), md)
			errs <- err
		}()
	}
	for range cap(errs) {
		if err := <-errs; err != nil {
			t.Fatalf("an overlapping retry failed: %v", err)
		}
	}
	waitState(t, "prefill WaitingForInput", prePoll(t, p, room), pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT)
	if _, ds := pollState(t, p, room); ds.State == pb.RoomState_ROOM_STATE_FAILED {
		t.Fatalf("decode room after overlapping retries: %v", ds)
	}
}

// A Send retried after a client timeout is the same request: OK, also
// once the room moved on to Success. Another chunk at a taken position is
// still refused.
func TestSendRetriedWithTheSameChunkIsIdempotent(t *testing.T) {
	p := startQuickPair(t)
	registerRegions(t, p)
	const room = 26
	openBoth(t, p, room)
	if _, err := p.decode.SendMetadata(ctxT(t), &pb.SendMetadataRequest{RoomId: room, DstPages: &pb.PageList{Indices: []int32{1, 2, 3, 4}}}); err != nil {
		t.Fatal(err)
	}
	waitState(t, "prefill WaitingForInput", prePoll(t, p, room), pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT)
	first := &pb.SendRequest{RoomId: room, Pages: &pb.PageList{Indices: []int32{5, 6}}}
	last := &pb.SendRequest{RoomId: room, StartPosition: 2, Pages: &pb.PageList{Runs: []*pb.PageRun{{Start: 7, Count: 2}}}, Last: true, AuxIndex: 1}
	for i, req := range []*pb.SendRequest{first, first, last, last} {
		if i == 2 {
			_, err := p.prefill.Send(ctxT(t), &pb.SendRequest{RoomId: room, Pages: &pb.PageList{Indices: []int32{5, 9}}})
			wantField(t, err, "start_position")
		}
		if _, err := p.prefill.Send(ctxT(t), req); err != nil {
			t.Fatalf("send at %d (last %v): %v", req.StartPosition, req.Last, err)
		}
	}
	waitState(t, "decode Success", decPoll(t, p, room), pb.RoomState_ROOM_STATE_SUCCESS)
	for _, req := range []*pb.SendRequest{first, last} {
		if _, err := p.prefill.Send(ctxT(t), req); err != nil {
			t.Fatalf("retry after Success at %d: %v", req.StartPosition, err)
		}
	}
	_, err := p.prefill.Send(ctxT(t), &pb.SendRequest{RoomId: room, Pages: &pb.PageList{Indices: []int32{5, 9}}})
	wantCode(t, err, codes.FailedPrecondition, "last chunk")
	other := &pb.SendRequest{RoomId: room, StartPosition: 2, Pages: &pb.PageList{Runs: []*pb.PageRun{{Start: 7, Count: 2}}}, Last: true, AuxIndex: 2}
	_, err = p.prefill.Send(ctxT(t), other)
	wantCode(t, err, codes.FailedPrecondition, "last chunk")
}
