package service

import (
	"bytes"
	"context"
	"hash/crc32"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/internal/daemon"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// heldChunk is a data connection, dialled by the test straight to decode's data listener,
// that sent one chunk for a room and only the start of its payload: the receiver's
// connection goroutine is inside the room's pages, waiting for the rest, so the room's
// Fence cannot return until release sends it.
type heldChunk struct {
	c    net.Conn
	rest []byte
}

// holdChunk sends the chunk header and the first n bytes of one page for buffer 0 page dst
// of key, and waits until those bytes are in decode's region (mem maps the same file).
func holdChunk(t *testing.T, addr string, key transfer.Key, mem *transfer.Region, dst int32, n int) *heldChunk {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() }) // a test that stops early still lets the fence return
	run := []transfer.ChunkRun{{Buffer: 0, Run: transfer.Run{Start: dst, Count: 1}}}
	itemLen := mem.Layout().Buffers[0].ItemLen
	payload := bytes.Repeat([]byte{0x5A}, int(itemLen))
	frame := transfer.AppendRuns(make([]byte, transfer.HeaderSize), run)
	h := transfer.Header{Type: transfer.FrameChunk, Flags: transfer.FlagPayloadCRC, Room: key.Room, Nonce: key.Nonce, Rank: key.Rank,
		NumRuns: 1, Pages: 1, PayloadLen: uint64(itemLen),
		PayloadCRC: crc32.Checksum(payload, crc32.MakeTable(crc32.Castagnoli)),
		RunsCRC:    transfer.RunsChecksum(frame[transfer.HeaderSize:])}
	h.Encode(frame)
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(append(frame, payload[:n]...)); err != nil {
		t.Fatal(err)
	}
	page := mem.Pages(0, transfer.Run{Start: dst, Count: 1})
	eventually(t, "the held chunk's first bytes land", func() bool { return bytes.Equal(page[:n], payload[:n]) })
	return &heldChunk{c: c, rest: payload[n:]}
}

func (h *heldChunk) release(t *testing.T) {
	t.Helper()
	h.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := h.c.Write(h.rest); err != nil {
		t.Fatal(err)
	}
}

// watchLog collects a Watch stream's events on a goroutine that ends with the stream.
type watchLog struct {
	mu     sync.Mutex
	events []*pb.WatchEvent
	more   chan struct{}
}

func startWatch(t *testing.T, c pb.DecodeServiceClient) *watchLog {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := c.Watch(ctx, &pb.DecodeServiceWatchRequest{})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if _, err := stream.Header(); err != nil { // subscribed from here on
		cancel()
		t.Fatal(err)
	}
	w := &watchLog{more: make(chan struct{}, 1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			w.mu.Lock()
			w.events = append(w.events, resp.Event)
			w.mu.Unlock()
			select {
			case w.more <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return w
}

// index returns the position of the first transition of room to state, or -1.
func (w *watchLog) index(room uint64, to pb.RoomState) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, ev := range w.events {
		if tr := ev.GetTransition(); tr != nil && tr.RoomId == room && tr.To == to {
			return i
		}
	}
	return -1
}

// await waits (bounded) for a transition of room to state and returns its position.
func (w *watchLog) await(t *testing.T, room uint64, to pb.RoomState) int {
	t.Helper()
	deadline := time.After(15 * time.Second)
	for {
		if i := w.index(room, to); i >= 0 {
			return i
		}
		select {
		case <-w.more:
		case <-deadline:
			t.Fatalf("watch: no transition of room %d to %v within 15s", room, to)
		}
	}
}

// I9 at the gRPC edge: decode aborts a room while one of its chunks is half written on a
// data connection, so the room is Failed inside the daemon but its Fence waits for that
// write. Until the fence returns, no answer to the scheduler shows Failed: Poll, GetRoom's
// and ListRooms' visible_state, the Watch stream, the error SendMetadata returns and Clear
// (which would let the scheduler free the pages) all still see a live room, and the Abort
// call itself does not return. Once the write completes and the fence returns, every one
// of them shows Failed with its reason. GetRoom's state (the operator's view of the held
// state) shows Failed during the window: the proof that the test holds the fence at all.
func TestRPCsShowFailedOnlyAfterFence_I9(t *testing.T) {
	p := startPairWith(t, func(_, dec *daemon.Config) {
		// The held chunk keeps the fence waiting until the transfer-idle deadline at most;
		// make that (and the room's other deadlines) far longer than the test.
		dec.TransferIdleTimeout, dec.WaitingTimeout, dec.BootstrapTimeout = time.Minute, time.Minute, time.Minute
	})
	_, dec := registerRegions(t, p)
	const room, marker = 71, 72
	const dstPage = 9
	watch := startWatch(t, p.decode)

	if _, err := p.prefill.OpenSender(ctxT(t), &pb.OpenSenderRequest{RoomId: room}); err != nil {
		t.Fatal(err)
	}
	ro, err := p.decode.OpenReceiver(ctxT(t), &pb.OpenReceiverRequest{RoomId: room, PrefillBootstrapAddr: p.bootstrap})
	if err != nil {
		t.Fatal(err)
	}
	key := transfer.Key{Room: room, Nonce: ro.Status.Nonce, Rank: transfer.Rank{TP: 0, Size: 1}}
	if _, err := p.decode.SendMetadata(ctxT(t), &pb.SendMetadataRequest{RoomId: room, DstPages: &pb.PageList{Indices: []int32{dstPage}}}); err != nil {
		t.Fatal(err)
	}
	var dataAddr string // prefill names its room's peer by the decode data endpoint
	eventually(t, "prefill binds the room", func() bool {
		gr, err := p.preAdmin.GetRoom(ctxT(t), &pb.GetRoomRequest{RoomId: room})
		if err != nil || gr.Room.VisibleState != pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT {
			return false
		}
		dataAddr = gr.Room.Peer
		return true
	})
	eventually(t, "decode sees WaitingForInput", func() bool {
		_, ds := pollState(t, p, room)
		return ds.State == pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT
	})
	held := holdChunk(t, dataAddr, key, dec.mem, dstPage, 512)

	type abortAnswer struct {
		resp *pb.DecodeServiceAbortResponse
		err  error
	}
	aborted := make(chan abortAnswer, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		resp, err := p.decode.Abort(ctx, &pb.DecodeServiceAbortRequest{RoomId: room})
		aborted <- abortAnswer{resp, err}
	}()
	eventually(t, "decode holds the room Failed", func() bool {
		gr, err := p.decAdmin.GetRoom(ctxT(t), &pb.GetRoomRequest{RoomId: room})
		return err == nil && gr.Room.State == pb.RoomState_ROOM_STATE_FAILED
	})

	// The window: Failed inside decode, fence held by the chunk in progress.
	failed := pb.RoomState_ROOM_STATE_FAILED
	if _, ds := pollState(t, p, room); ds.State == failed || ds.Reason != "" {
		t.Errorf("Poll shows %v (reason %q) before the fence", ds.State, ds.Reason)
	}
	if gr, err := p.decAdmin.GetRoom(ctxT(t), &pb.GetRoomRequest{RoomId: room}); err != nil || gr.Room.VisibleState == failed {
		t.Errorf("GetRoom visible_state %v (%v) before the fence", gr.GetRoom().GetVisibleState(), err)
	}
	lr, err := p.decAdmin.ListRooms(ctxT(t), &pb.ListRoomsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range lr.Rooms {
		if in.RoomId == room && in.VisibleState == failed {
			t.Error("ListRooms visible_state Failed before the fence")
		}
	}
	_, err = p.decode.SendMetadata(ctxT(t), &pb.SendMetadataRequest{RoomId: room, DstPages: &pb.PageList{Indices: []int32{dstPage}}})
	if st := status.Convert(err); err == nil || st.Code() != codes.FailedPrecondition || strings.Contains(strings.ToLower(st.Message()), "fail") {
		t.Errorf("SendMetadata before the fence: %v; want FailedPrecondition that does not say Failed", err)
	}
	cr, err := p.decode.Clear(ctxT(t), &pb.DecodeServiceClearRequest{RoomIds: []uint64{room}})
	if err != nil {
		t.Fatal(err)
	}
	if res := cr.Results[0]; res.Cleared || res.Error != "NOT_TERMINAL" {
		t.Errorf("Clear before the fence: %+v; want NOT_TERMINAL", res)
	}
	again, err := p.decode.Abort(ctxT(t), &pb.DecodeServiceAbortRequest{RoomId: room})
	if err != nil || again.Status.State == failed || again.Status.Reason != "" {
		t.Errorf("a second Abort before the fence answered %v %v", again, err)
	}
	// Any transition published so far reaches the stream before the marker room's open.
	if _, err := p.decode.OpenReceiver(ctxT(t), &pb.OpenReceiverRequest{RoomId: marker, PrefillBootstrapAddr: p.bootstrap}); err != nil {
		t.Fatal(err)
	}
	markerAt := watch.await(t, marker, pb.RoomState_ROOM_STATE_BOOTSTRAPPING)
	if i := watch.index(room, failed); i >= 0 {
		t.Errorf("Watch sent Failed (event %d) before the fence", i)
	}
	select {
	case a := <-aborted:
		t.Fatalf("Abort returned before the fence: %v %v", a.resp, a.err)
	default:
	}

	held.release(t)
	a := <-aborted
	if a.err != nil || a.resp.Status.State != failed || a.resp.Status.Reason != "aborted:local" {
		t.Fatalf("Abort after the fence: %v %v; want Failed(aborted:local)", a.resp, a.err)
	}
	if at := watch.await(t, room, failed); at < markerAt {
		t.Errorf("Watch sent Failed at event %d, before the marker at %d", at, markerAt)
	}
	if _, ds := pollState(t, p, room); ds.State != failed || ds.Reason != "aborted:local" {
		t.Errorf("Poll after the fence: %v (%q); want Failed(aborted:local)", ds.State, ds.Reason)
	}
	if gr, err := p.decAdmin.GetRoom(ctxT(t), &pb.GetRoomRequest{RoomId: room}); err != nil || gr.Room.VisibleState != failed {
		t.Errorf("GetRoom after the fence: %v %v", gr, err)
	}
	if cr, err := p.decode.Clear(ctxT(t), &pb.DecodeServiceClearRequest{RoomIds: []uint64{room}}); err != nil || !cr.Results[0].Cleared {
		t.Errorf("Clear after the fence: %v %v", cr, err)
	}
	// End the marker room so the daemons stop without waiting out their drain.
	if _, err := p.decode.Abort(ctxT(t), &pb.DecodeServiceAbortRequest{RoomId: marker}); err != nil {
		t.Fatal(err)
	}
}
