package service

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/internal/daemon"
)

type rpcCase struct {
	name  string
	call  func(ctx context.Context) error
	code  codes.Code
	field string // for InvalidArgument: the field the detail must name
}

func runCases(t *testing.T, cases []rpcCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.call(ctxT(t))
			if status.Code(err) != c.code {
				t.Fatalf("got %v, want %v", err, c.code)
			}
			if c.field != "" {
				wantField(t, err, c.field)
			}
		})
	}
}

func TestEveryRPCRefusesBadInputWithTheRightCode(t *testing.T) {
	p := startPair(t)
	// Before any region is registered: FailedPrecondition, not a crash.
	runCases(t, []rpcCase{
		{"decode open before region", func(ctx context.Context) error {
			_, err := p.decode.OpenReceiver(ctx, &pb.OpenReceiverRequest{RoomId: 1, PrefillBootstrapAddr: p.bootstrap})
			return err
		}, codes.FailedPrecondition, ""},
		{"prefill send before region", func(ctx context.Context) error {
			_, err := p.prefill.Send(ctx, &pb.SendRequest{RoomId: 1, Pages: &pb.PageList{Indices: []int32{0}}})
			return err
		}, codes.FailedPrecondition, ""},
	})
	pre, _ := registerRegions(t, p)
	pages := int32(pre.layout.Buffers[0].Pages())
	if _, err := p.prefill.OpenSender(ctxT(t), &pb.OpenSenderRequest{RoomId: 7}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.decode.OpenReceiver(ctxT(t), &pb.OpenReceiverRequest{RoomId: 8, PrefillBootstrapAddr: p.bootstrap}); err != nil {
		t.Fatal(err)
	}
	runCases(t, []rpcCase{
		// RegisterRegion
		{"prefill region without path", func(ctx context.Context) error {
			_, err := p.prefill.RegisterRegion(ctx, &pb.PrefillServiceRegisterRegionRequest{Layout: layoutPB(pre.layout)})
			return err
		}, codes.InvalidArgument, "region_path"},
		{"decode region without layout", func(ctx context.Context) error {
			_, err := p.decode.RegisterRegion(ctx, &pb.DecodeServiceRegisterRegionRequest{RegionPath: pre.path})
			return err
		}, codes.InvalidArgument, "layout"},
		{"rank of another tp_size", func(ctx context.Context) error {
			l := layoutPB(pre.layout)
			l.Rank = &pb.Rank{TpRank: 1, TpSize: 2}
			_, err := p.prefill.RegisterRegion(ctx, &pb.PrefillServiceRegisterRegionRequest{RegionPath: pre.path, Layout: l})
			return err
		}, codes.InvalidArgument, "layout.rank"},
		// OpenSender
		{"open room 0", func(ctx context.Context) error {
			_, err := p.prefill.OpenSender(ctx, &pb.OpenSenderRequest{RoomId: 0})
			return err
		}, codes.InvalidArgument, "room_id"},
		{"open live duplicate", func(ctx context.Context) error {
			_, err := p.prefill.OpenSender(ctx, &pb.OpenSenderRequest{RoomId: 7})
			return err
		}, codes.AlreadyExists, ""},
		{"open room id over 63 bits", func(ctx context.Context) error {
			_, err := p.prefill.OpenSender(ctx, &pb.OpenSenderRequest{RoomId: 1 << 63})
			return err
		}, codes.InvalidArgument, "room_id"},
		// Send
		{"send before metadata", func(ctx context.Context) error {
			_, err := p.prefill.Send(ctx, &pb.SendRequest{RoomId: 7, Pages: &pb.PageList{Indices: []int32{0}}})
			return err
		}, codes.FailedPrecondition, ""},
		{"send page out of range", func(ctx context.Context) error {
			_, err := p.prefill.Send(ctx, &pb.SendRequest{RoomId: 7, Pages: &pb.PageList{Indices: []int32{pages}}})
			return err
		}, codes.InvalidArgument, "pages.indices[0]"},
		{"send repeated page", func(ctx context.Context) error {
			_, err := p.prefill.Send(ctx, &pb.SendRequest{RoomId: 7, Pages: &pb.PageList{Runs: []*pb.PageRun{{Start: 1, Count: 3}, {Start: 2, Count: 1}}}})
			return err
		}, codes.InvalidArgument, "pages"},
		{"send bad rank", func(ctx context.Context) error {
			_, err := p.prefill.Send(ctx, &pb.SendRequest{RoomId: 7, Rank: &pb.Rank{TpRank: 3, TpSize: 2}, Pages: &pb.PageList{Indices: []int32{0}}})
			return err
		}, codes.InvalidArgument, "rank"},
		{"send buffer out of range", func(ctx context.Context) error {
			_, err := p.prefill.Send(ctx, &pb.SendRequest{RoomId: 7, Buffers: []uint32{uint32(len(pre.layout.Buffers))}, Pages: &pb.PageList{Indices: []int32{0}}})
			return err
		}, codes.InvalidArgument, "buffers[0]"},
		{"send buffer named twice", func(ctx context.Context) error {
			_, err := p.prefill.Send(ctx, &pb.SendRequest{RoomId: 7, Buffers: []uint32{0, 0}, Pages: &pb.PageList{Indices: []int32{0}}})
			return err
		}, codes.InvalidArgument, "buffers[1]"},
		// OpenReceiver
		{"receiver bad bootstrap", func(ctx context.Context) error {
			_, err := p.decode.OpenReceiver(ctx, &pb.OpenReceiverRequest{RoomId: 9, PrefillBootstrapAddr: "127.0.0.1:1"})
			return err
		}, codes.InvalidArgument, "prefill_bootstrap_addr"},
		{"receiver duplicate", func(ctx context.Context) error {
			_, err := p.decode.OpenReceiver(ctx, &pb.OpenReceiverRequest{RoomId: 8, PrefillBootstrapAddr: p.bootstrap})
			return err
		}, codes.AlreadyExists, ""},
		{"receiver too many senders", func(ctx context.Context) error {
			_, err := p.decode.OpenReceiver(ctx, &pb.OpenReceiverRequest{RoomId: 9, PrefillBootstrapAddr: p.bootstrap, ExpectedSenders: 65})
			return err
		}, codes.InvalidArgument, "expected_senders"},
		// SendMetadata
		{"metadata prefix over its pages", func(ctx context.Context) error {
			_, err := p.decode.SendMetadata(ctx, &pb.SendMetadataRequest{RoomId: 8, DstPages: &pb.PageList{Indices: []int32{0, 1}}, PrefixLen: 3})
			return err
		}, codes.InvalidArgument, "prefix_len"},
		{"metadata unknown room", func(ctx context.Context) error {
			_, err := p.decode.SendMetadata(ctx, &pb.SendMetadataRequest{RoomId: 99, DstPages: &pb.PageList{Indices: []int32{0}}})
			return err
		}, codes.NotFound, ""},
		{"metadata both indices and runs", func(ctx context.Context) error {
			_, err := p.decode.SendMetadata(ctx, &pb.SendMetadataRequest{RoomId: 8, DstPages: &pb.PageList{Indices: []int32{0}, Runs: []*pb.PageRun{{Start: 1, Count: 1}}}})
			return err
		}, codes.InvalidArgument, "dst_pages"},
		{"metadata aux out of range", func(ctx context.Context) error {
			_, err := p.decode.SendMetadata(ctx, &pb.SendMetadataRequest{RoomId: 8, DstPages: &pb.PageList{Indices: []int32{0}}, AuxIndex: 1000})
			return err
		}, codes.InvalidArgument, "aux_index"},
		// Poll, Abort, Clear
		{"poll empty", func(ctx context.Context) error {
			_, err := p.prefill.Poll(ctx, &pb.PrefillServicePollRequest{})
			return err
		}, codes.InvalidArgument, "room_ids"},
		{"poll zero id", func(ctx context.Context) error {
			_, err := p.decode.Poll(ctx, &pb.DecodeServicePollRequest{RoomIds: []uint64{5, 0}})
			return err
		}, codes.InvalidArgument, "room_ids[1]"},
		{"abort unknown", func(ctx context.Context) error {
			_, err := p.decode.Abort(ctx, &pb.DecodeServiceAbortRequest{RoomId: 12345})
			return err
		}, codes.NotFound, ""},
		{"abort zero", func(ctx context.Context) error {
			_, err := p.prefill.Abort(ctx, &pb.PrefillServiceAbortRequest{})
			return err
		}, codes.InvalidArgument, "room_id"},
		{"clear empty", func(ctx context.Context) error {
			_, err := p.decode.Clear(ctx, &pb.DecodeServiceClearRequest{})
			return err
		}, codes.InvalidArgument, "room_ids"},
		// Admin
		{"list page size", func(ctx context.Context) error {
			_, err := p.preAdmin.ListRooms(ctx, &pb.ListRoomsRequest{PageSize: 5000})
			return err
		}, codes.InvalidArgument, "page_size"},
		{"list negative age", func(ctx context.Context) error {
			_, err := p.preAdmin.ListRooms(ctx, &pb.ListRoomsRequest{MinAge: durationpb.New(-1)})
			return err
		}, codes.InvalidArgument, "min_age"},
		{"list bad token", func(ctx context.Context) error {
			_, err := p.decAdmin.ListRooms(ctx, &pb.ListRoomsRequest{PageToken: "x"})
			return err
		}, codes.InvalidArgument, "page_token"},
		{"get unknown", func(ctx context.Context) error {
			_, err := p.decAdmin.GetRoom(ctx, &pb.GetRoomRequest{RoomId: 4242})
			return err
		}, codes.NotFound, ""},
	})

	// Refused requests changed nothing: the two rooms are still the only ones.
	lr, err := p.preAdmin.ListRooms(ctxT(t), &pb.ListRoomsRequest{})
	if err != nil || len(lr.Rooms) != 1 || lr.Rooms[0].RoomId != 7 {
		t.Fatalf("prefill rooms after refused requests: %v %v", lr, err)
	}
	// Clear of a live room is refused per room, not for the batch.
	cr, err := p.prefill.Clear(ctxT(t), &pb.PrefillServiceClearRequest{RoomIds: []uint64{7, 555}})
	if err != nil || cr.Results[0].Error != "NOT_TERMINAL" || cr.Results[1].Error != "NOT_FOUND" {
		t.Fatalf("clear results %v %v", cr, err)
	}
}

func TestOverMaxRoomsIsResourceExhausted(t *testing.T) {
	p := startPairWith(t, func(pre, dec *daemon.Config) { pre.MaxRooms = 2 })
	for id := uint64(1); id <= 2; id++ {
		if _, err := p.prefill.OpenSender(ctxT(t), &pb.OpenSenderRequest{RoomId: id}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := p.prefill.OpenSender(ctxT(t), &pb.OpenSenderRequest{RoomId: 3})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("third room: %v, want ResourceExhausted", err)
	}
}
