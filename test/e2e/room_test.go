package e2e

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/transfer"
)

func grpcConn(t *testing.T, unixPath string) *grpc.ClientConn {
	t.Helper()
	c, err := grpc.NewClient("unix://"+unixPath, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// metric scrapes a daemon and returns the sum of the samples whose line
// starts with prefix (one series when the prefix names all its labels). A
// prefix that matches nothing fails the test: a missing series must not
// read as zero.
func metric(t *testing.T, httpAddr, prefix string) float64 {
	t.Helper()
	_, body := httpGet(t, "http://"+httpAddr+"/metrics")
	var sum float64
	found := false
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("sample %q: %v", line, err)
		}
		sum, found = sum+v, true
	}
	if !found {
		t.Fatalf("no sample %s", prefix)
	}
	return sum
}

func debugRoomIDs(t *testing.T, httpAddr string) []uint64 {
	t.Helper()
	_, body := httpGet(t, "http://"+httpAddr+"/debug/rooms")
	var d struct {
		Rooms []struct {
			Room uint64 `json:"room"`
		} `json:"rooms"`
	}
	if err := json.Unmarshal([]byte(body), &d); err != nil {
		t.Fatalf("/debug/rooms: %v\n%s", err, body)
	}
	var ids []uint64
	for _, r := range d.Rooms {
		ids = append(ids, r.Room)
	}
	return ids
}

// Two real processes: one room from OpenReceiver/OpenSender to Success on
// both sides, bytes checked in the decode engine's memory, then Clear. The
// metrics and /debug/rooms show the room while it is held and not after.
func TestOneRoomAcrossTwoProcesses(t *testing.T) {
	pre, dec, _ := pairProcs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prefill := pb.NewPrefillServiceClient(grpcConn(t, pre.GRPCAddr))
	decode := pb.NewDecodeServiceClient(grpcConn(t, dec.GRPCAddr))
	bootstrap := pre.LogField("bootstrap socket bound", "addr")

	layout := transfer.UniformLayout(2, 32, 8192, 4, 64)
	regions := map[string]*transfer.Region{}
	lp := &pb.RegionLayout{Rank: &pb.Rank{TpSize: 1}, Aux: &pb.AuxSpec{Offset: uint64(layout.Aux.Offset), RowLen: 64, Rows: 4}}
	for _, b := range layout.Buffers {
		lp.Buffers = append(lp.Buffers, &pb.BufferSpec{Offset: uint64(b.Offset), Length: uint64(b.Length), ItemLen: uint32(b.ItemLen)})
	}
	for _, side := range []string{"prefill", "decode"} {
		path, err := transfer.CreateRegionFile(regionDir(t), layout)
		if err != nil {
			t.Fatal(err)
		}
		r, err := transfer.OpenRegion(path, layout)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		regions[side] = r
		if side == "prefill" {
			_, err = prefill.RegisterRegion(ctx, &pb.PrefillServiceRegisterRegionRequest{RegionPath: path, Layout: lp})
		} else {
			_, err = decode.RegisterRegion(ctx, &pb.DecodeServiceRegisterRegionRequest{RegionPath: path, Layout: lp})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	src, dst := []int32{1, 2, 3, 9}, []int32{30, 4, 5, 6}
	for b := range layout.Buffers {
		for i, p := range src {
			page := regions["prefill"].Pages(b, transfer.Run{Start: p, Count: 1})
			for j := range page {
				page[j] = byte(1 + b + 3*i + j%251)
			}
		}
	}
	const room = 4711
	if _, err := decode.OpenReceiver(ctx, &pb.OpenReceiverRequest{RoomId: room, PrefillBootstrapAddr: bootstrap}); err != nil {
		t.Fatal(err)
	}
	if _, err := prefill.OpenSender(ctx, &pb.OpenSenderRequest{RoomId: room}); err != nil {
		t.Fatal(err)
	}
	for _, d := range []struct{ name, addr string }{{"prefill", pre.HTTPAddr}, {"decode", dec.HTTPAddr}} {
		if got := metric(t, d.addr, `pdlink_inflight_rooms{side="`+d.name+`"}`); got != 1 {
			t.Errorf("%s inflight %v while the room is open", d.name, got)
		}
		if ids := debugRoomIDs(t, d.addr); len(ids) != 1 || ids[0] != room {
			t.Errorf("%s /debug/rooms %v while the room is open", d.name, ids)
		}
	}
	if _, err := decode.SendMetadata(ctx, &pb.SendMetadataRequest{RoomId: room, DstPages: &pb.PageList{Indices: dst}, AuxIndex: 1}); err != nil {
		t.Fatal(err)
	}
	poll := func() (pb.RoomState, pb.RoomState) {
		p, err := prefill.Poll(ctx, &pb.PrefillServicePollRequest{RoomIds: []uint64{room}})
		if err != nil {
			t.Fatal(err)
		}
		d, err := decode.Poll(ctx, &pb.DecodeServicePollRequest{RoomIds: []uint64{room}})
		if err != nil {
			t.Fatal(err)
		}
		return p.Statuses[0].State, d.Statuses[0].State
	}
	waitFor := func(what string, cond func(p, d pb.RoomState) bool) {
		deadline := time.Now().Add(15 * time.Second)
		for {
			p, d := poll()
			if cond(p, d) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: prefill %v decode %v", what, p, d)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	waitFor("prefill WaitingForInput", func(p, _ pb.RoomState) bool { return p == pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT })
	if _, err := prefill.Send(ctx, &pb.SendRequest{RoomId: room, Pages: &pb.PageList{Indices: src}, Last: true, AuxIndex: 2}); err != nil {
		t.Fatal(err)
	}
	waitFor("Success on both sides", func(p, d pb.RoomState) bool {
		return p == pb.RoomState_ROOM_STATE_SUCCESS && d == pb.RoomState_ROOM_STATE_SUCCESS
	})
	for b := range layout.Buffers {
		for i := range src {
			want := regions["prefill"].Pages(b, transfer.Run{Start: src[i], Count: 1})
			got := regions["decode"].Pages(b, transfer.Run{Start: dst[i], Count: 1})
			if string(want) != string(got) {
				t.Fatalf("buffer %d: decode page %d differs from prefill page %d", b, dst[i], src[i])
			}
		}
	}
	if _, err := prefill.Clear(ctx, &pb.PrefillServiceClearRequest{RoomIds: []uint64{room}}); err != nil {
		t.Fatal(err)
	}
	if _, err := decode.Clear(ctx, &pb.DecodeServiceClearRequest{RoomIds: []uint64{room}}); err != nil {
		t.Fatal(err)
	}
	for _, d := range []struct{ name, addr string }{{"prefill", pre.HTTPAddr}, {"decode", dec.HTTPAddr}} {
		if got := metric(t, d.addr, `pdlink_inflight_rooms{side="`+d.name+`"}`); got != 0 {
			t.Errorf("%s inflight %v after Clear", d.name, got)
		}
		if got := metric(t, d.addr, `pdlink_rooms{side="`+d.name+`",state="Success"}`); got != 0 {
			t.Errorf("%s still holds a Success room after Clear: %v", d.name, got)
		}
		if ids := debugRoomIDs(t, d.addr); len(ids) != 0 {
			t.Errorf("%s /debug/rooms %v after Clear", d.name, ids)
		}
	}
}
