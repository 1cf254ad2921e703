package service

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/internal/daemon"
)

// Each daemon answers health by the full name of every pdlink service it
// serves, as for ""; the other daemon's service stays NotFound.
func TestHealthAnswersForEveryServiceTheDaemonServes(t *testing.T) {
	p := startPair(t)
	for _, c := range []struct {
		s        *daemon.Server
		serves   []string
		notFound string
	}{
		{p.pre, []string{"", "pdlink.v1.PrefillService", "pdlink.v1.AdminService"}, "pdlink.v1.DecodeService"},
		{p.dec, []string{"", "pdlink.v1.DecodeService", "pdlink.v1.AdminService"}, "pdlink.v1.PrefillService"},
	} {
		hc := healthpb.NewHealthClient(client(t, c.s))
		for _, name := range c.serves {
			resp, err := hc.Check(ctxT(t), &healthpb.HealthCheckRequest{Service: name})
			if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("%s health %q = %v, %v; want SERVING", c.s.GRPCAddr(), name, resp, err)
			}
		}
		if _, err := hc.Check(ctxT(t), &healthpb.HealthCheckRequest{Service: c.notFound}); status.Code(err) != codes.NotFound {
			t.Errorf("%s health %q = %v; want NotFound", c.s.GRPCAddr(), c.notFound, err)
		}
	}
}

// A state number the enum does not define is refused naming the field;
// before, 999 and -1 read as UNSPECIFIED and listed every room.
func TestListRoomsRefusesAnUndefinedStateNamingTheField(t *testing.T) {
	p := startPair(t)
	if _, err := p.prefill.OpenSender(ctxT(t), &pb.OpenSenderRequest{RoomId: 9}); err != nil {
		t.Fatal(err)
	}
	for _, admin := range []pb.AdminServiceClient{p.preAdmin, p.decAdmin} {
		for _, v := range []int32{999, -1, 6} {
			_, err := admin.ListRooms(ctxT(t), &pb.ListRoomsRequest{State: pb.RoomState(v)})
			wantField(t, err, "state")
		}
	}
	resp, err := p.preAdmin.ListRooms(ctxT(t), &pb.ListRoomsRequest{State: pb.RoomState_ROOM_STATE_UNSPECIFIED})
	if err != nil || len(resp.Rooms) != 1 {
		t.Fatalf("ListRooms(UNSPECIFIED) = %v, %v; want the one room", resp, err)
	}
}

// Watch with an undefined to_states value (or UNSPECIFIED, which no
// transition goes to) is refused at once; before, it was accepted and then
// delivered nothing.
func TestWatchRefusesToStatesThatMatchNothingNamingTheField(t *testing.T) {
	p := startPair(t)
	cases := []struct {
		states []pb.RoomState
		field  string
	}{
		{[]pb.RoomState{12345}, "filter.to_states[0]"},
		{[]pb.RoomState{pb.RoomState_ROOM_STATE_FAILED, -3}, "filter.to_states[1]"},
		{[]pb.RoomState{pb.RoomState_ROOM_STATE_UNSPECIFIED}, "filter.to_states[0]"},
	}
	for _, c := range cases {
		filter := &pb.WatchFilter{ToStates: c.states}
		ps, err := p.prefill.Watch(ctxT(t), &pb.PrefillServiceWatchRequest{Filter: filter})
		if err == nil {
			_, err = ps.Recv()
		}
		wantField(t, err, c.field)
		ds, err := p.decode.Watch(ctxT(t), &pb.DecodeServiceWatchRequest{Filter: filter})
		if err == nil {
			_, err = ds.Recv()
		}
		wantField(t, err, c.field)
	}
}

// /debug/rooms?state= takes the spelling pdctl prints (waiting_for_input),
// the metric label and the gRPC name; before, only the metric label.
func TestDebugRoomsStateFilterAcceptsEverySpelling(t *testing.T) {
	p := startPair(t)
	registerRegions(t, p)
	const room = 11
	if _, err := p.prefill.OpenSender(ctxT(t), &pb.OpenSenderRequest{RoomId: room}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.decode.OpenReceiver(ctxT(t), &pb.OpenReceiverRequest{RoomId: room, PrefillBootstrapAddr: p.bootstrap}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.decode.SendMetadata(ctxT(t), &pb.SendMetadataRequest{RoomId: room, DstPages: &pb.PageList{Indices: []int32{1}}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "prefill WaitingForInput", func() bool {
		ps, _ := pollState(t, p, room)
		return ps.State == pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT
	})
	for _, s := range []string{"waiting_for_input", "WaitingForInput", "ROOM_STATE_WAITING_FOR_INPUT", "waiting-for-input", "WAITING_FOR_INPUT"} {
		code, body := debugGet(t, p.preHTTP+"/debug/rooms?state="+url.QueryEscape(s))
		var d debugRooms
		if code != http.StatusOK || json.Unmarshal([]byte(body), &d) != nil || len(d.Rooms) != 1 || d.Rooms[0].Room != room {
			t.Errorf("/debug/rooms?state=%s = %d %s; want room %d", s, code, body, room)
		}
	}
	code, body := debugGet(t, p.preHTTP+"/debug/rooms?state=bootstrapping")
	if code != http.StatusOK || !strings.Contains(body, `"rooms": []`) {
		t.Errorf("/debug/rooms?state=bootstrapping = %d %s; want no rooms", code, body)
	}
	code, body = debugGet(t, p.preHTTP+"/debug/rooms?state=waiting")
	if code != http.StatusBadRequest || !strings.Contains(body, "waiting_for_input") {
		t.Errorf("/debug/rooms?state=waiting = %d %q; want 400 listing the states", code, body)
	}
}

func debugGet(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
