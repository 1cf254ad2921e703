package service

import (
	"encoding/json"
	"fmt"
	"os"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/internal/daemon"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// Issue 15, "Region lifecycle": an engine that restarts deletes its region
// file and creates a new one at the same path. These tests play that
// engine on either side and check no room reaches Success with its bytes
// in the dead inode.

// recreate deletes the region file at r.path and creates a new, zeroed one
// at the same path (what an engine restart with a fixed file name does),
// mapped for the test as the engine maps it.
func recreate(t *testing.T, r region) region {
	t.Helper()
	if err := os.Remove(r.path); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(r.path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(r.layout.Size()); err != nil {
		t.Fatal(err)
	}
	f.Close()
	mem, err := transfer.OpenRegion(r.path, r.layout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	return region{r.path, r.layout, mem}
}

// fillSource writes a pattern unique to (room, buffer, position) into the
// source pages and the aux row.
func fillSource(r region, room uint64, src []int32, aux int64) {
	for b := range r.layout.Buffers {
		for i, pg := range src {
			page := r.mem.Pages(b, transfer.Run{Start: pg, Count: 1})
			for j := range page {
				page[j] = byte(int(room)*13 + b*31 + i*7 + j)
			}
		}
	}
	copy(r.mem.AuxRow(aux), fmt.Sprintf("room-%d-aux", room))
}

// samePages fails unless decode's dst pages and aux row hold the source's.
func samePages(t *testing.T, pre, dec region, src, dst []int32, srcAux, dstAux int64) {
	t.Helper()
	for b := range pre.layout.Buffers {
		for i := range src {
			want := pre.mem.Pages(b, transfer.Run{Start: src[i], Count: 1})
			got := dec.mem.Pages(b, transfer.Run{Start: dst[i], Count: 1})
			if string(got) != string(want) {
				t.Fatalf("buffer %d: decode page %d differs from source page %d", b, dst[i], src[i])
			}
		}
	}
	if string(pre.mem.AuxRow(srcAux)) != string(dec.mem.AuxRow(dstAux)) {
		t.Fatalf("aux row %d differs from source row %d", dstAux, srcAux)
	}
}

// untouched fails unless every byte of pages and of the aux row is zero.
func untouched(t *testing.T, what string, r region, pages []int32, aux int64) {
	t.Helper()
	for b := range r.layout.Buffers {
		for _, pg := range pages {
			for _, x := range r.mem.Pages(b, transfer.Run{Start: pg, Count: 1}) {
				if x != 0 {
					t.Fatalf("%s: buffer %d page %d was written", what, b, pg)
				}
			}
		}
	}
	for _, x := range r.mem.AuxRow(aux) {
		if x != 0 {
			t.Fatalf("%s: aux row %d was written", what, aux)
		}
	}
}

// openBound opens room on both sides with its metadata sent and waits for
// prefill to be WaitingForInput.
func openBound(t *testing.T, p *pair, room uint64, dst []int32, aux uint32) {
	t.Helper()
	if _, err := p.prefill.OpenSender(ctxT(t), &pb.OpenSenderRequest{RoomId: room}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.decode.OpenReceiver(ctxT(t), &pb.OpenReceiverRequest{RoomId: room, PrefillBootstrapAddr: p.bootstrap}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.decode.SendMetadata(ctxT(t), &pb.SendMetadataRequest{RoomId: room, DstPages: &pb.PageList{Indices: dst}, AuxIndex: aux}); err != nil {
		t.Fatal(err)
	}
	eventually(t, fmt.Sprintf("room %d WaitingForInput on prefill", room), func() bool {
		ps, _ := pollState(t, p, room)
		return ps.State == pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT
	})
}

// waitReplacedFailure waits for room to be Failed with region_replaced on
// the side whose region went and aborted:remote naming region_replaced on
// the other, and fails the test if either side ever shows Success.
func waitReplacedFailure(t *testing.T, p *pair, side string, room uint64) {
	t.Helper()
	eventually(t, fmt.Sprintf("room %d failed region_replaced", room), func() bool {
		ps, ds := pollState(t, p, room)
		if ps.State == pb.RoomState_ROOM_STATE_SUCCESS || ds.State == pb.RoomState_ROOM_STATE_SUCCESS {
			t.Fatalf("room %d reached Success with its region replaced: prefill %v, decode %v", room, ps, ds)
		}
		own, peer := ps, ds
		if side == "decode" {
			own, peer = ds, ps
		}
		return own.State == pb.RoomState_ROOM_STATE_FAILED && own.Reason == "region_replaced" &&
			peer.State == pb.RoomState_ROOM_STATE_FAILED && peer.Reason == "aborted:remote" && peer.PeerReason == "region_replaced"
	})
}

func registerSide(t *testing.T, p *pair, side string, r region) (gen, dev, ino uint64, failed uint32) {
	t.Helper()
	if side == "prefill" {
		resp, err := p.prefill.RegisterRegion(ctxT(t), &pb.PrefillServiceRegisterRegionRequest{RegionPath: r.path, Layout: layoutPB(r.layout)})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Generation, resp.Device, resp.Inode, resp.RoomsFailed
	}
	resp, err := p.decode.RegisterRegion(ctxT(t), &pb.DecodeServiceRegisterRegionRequest{RegionPath: r.path, Layout: layoutPB(r.layout)})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Generation, resp.Device, resp.Inode, resp.RoomsFailed
}

// runRoom moves one whole room and checks its bytes.
func runRoom(t *testing.T, p *pair, pre, dec region, room uint64, src, dst []int32) {
	t.Helper()
	fillSource(pre, room, src, 1)
	openBound(t, p, room, dst, 6)
	if _, err := p.prefill.Send(ctxT(t), &pb.SendRequest{RoomId: room, Pages: &pb.PageList{Indices: src}, Last: true, AuxIndex: 1}); err != nil {
		t.Fatal(err)
	}
	waitBothSuccess(t, p, room)
	samePages(t, pre, dec, src, dst, 1, 6)
}

func pages(from, n int32) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = from + int32(i)
	}
	return out
}

// The scenario, on either side: rooms in flight, the engine
// deletes and recreates its region file at the same path and registers it
// again. That is a new generation: the old generation's rooms fail with
// region_replaced here and aborted:remote/region_replaced on the peer,
// never Success; their last Send is refused; new rooms succeed with their
// bytes verified in the new file; and no byte of the new file is written
// for an old room. It used to answer OK (idempotent by path) and every
// room reached Success with the bytes in the dead inode.
//
// On both data transports, with the same reasons and counts: on the
// same-host path decoded stats the prefill file before each chunk it
// copies and may find it replaced before prefill's RegisterRegion does;
// prefill then fails the room region_replaced on decode's RESULT, and the
// register's rooms_failed counts it among the generation's rooms.
func TestReplacedRegionFileFailsItsRoomsAndNewRoomsUseTheNewFile(t *testing.T) {
	for _, kind := range []transfer.Kind{transfer.KindTCP, transfer.KindShm} {
		t.Run(string(kind), func(t *testing.T) { replacedRegionFileFailsItsRooms(t, kind) })
	}
}

func replacedRegionFileFailsItsRooms(t *testing.T, kind transfer.Kind) {
	for _, side := range []string{"prefill", "decode"} {
		t.Run(side, func(t *testing.T) {
			p := startPairWith(t, func(pre, dec *daemon.Config) {
				pre.DataTransport, dec.DataTransport = kind, kind
			})
			pre, dec := registerRegions(t, p)
			old := []uint64{1, 2, 3}
			for i, room := range old {
				src, dst := pages(int32(i)*4, 4), pages(32+int32(i)*4, 4)
				fillSource(pre, room, src, 0)
				openBound(t, p, room, dst, uint32(i))
				if _, err := p.prefill.Send(ctxT(t), &pb.SendRequest{RoomId: room, Pages: &pb.PageList{Indices: src[:2]}}); err != nil {
					t.Fatal(err)
				}
			}
			target := &pre
			if side == "decode" {
				target = &dec
			}
			_, _, oldIno, _ := registerSide(t, p, side, *target) // the same file: idempotent
			*target = recreate(t, *target)
			gen, _, ino, failed := registerSide(t, p, side, *target)
			if gen != 2 || ino == oldIno || failed != uint32(len(old)) {
				t.Fatalf("re-register of a recreated file: generation %d inode %d (was %d), rooms_failed %d; want generation 2, a new inode, %d rooms failed",
					gen, ino, oldIno, failed, len(old))
			}
			base := map[string]string{"prefill": p.preHTTP, "decode": p.decHTTP}[side]
			var dbg struct {
				Region struct {
					Generation uint64 `json:"generation"`
					Ino        uint64 `json:"ino"`
				} `json:"region"`
			}
			if err := json.Unmarshal([]byte(httpGet(t, base+"/debug/rooms")), &dbg); err != nil || dbg.Region.Generation != 2 || dbg.Region.Ino != ino {
				t.Errorf("/debug/rooms region on %s: %+v %v, want generation 2, inode %d", side, dbg.Region, err, ino)
			}
			if got := metric(t, base, `pdlink_region_replaced_total{side="`+side+`"}`); got != "1" {
				t.Errorf("pdlink_region_replaced_total on %s: %s, want 1", side, got)
			}
			for i, room := range old {
				waitReplacedFailure(t, p, side, room)
				_, err := p.prefill.Send(ctxT(t), &pb.SendRequest{RoomId: room, StartPosition: 2, Pages: &pb.PageList{Indices: pages(int32(i)*4+2, 2)}, Last: true})
				if status.Code(err) != codes.FailedPrecondition {
					t.Fatalf("last Send of replaced room %d: %v, want FailedPrecondition", room, err)
				}
			}
			for i, room := range []uint64{11, 12} {
				runRoom(t, p, pre, dec, room, pages(16+int32(i)*4, 4), pages(8+int32(i)*4, 4))
			}
			if side == "decode" {
				// Pages 32-43 and aux rows 0-2 were the old rooms'.
				untouched(t, "new decode file", dec, pages(32, 12), 0)
				untouched(t, "new decode file", dec, nil, 2)
			}
			for _, room := range old {
				ps, ds := pollState(t, p, room)
				if ps.State != pb.RoomState_ROOM_STATE_FAILED || ds.State != pb.RoomState_ROOM_STATE_FAILED {
					t.Fatalf("replaced room %d moved on: prefill %v, decode %v", room, ps.State, ds.State)
				}
			}
		})
	}
}

// The engine recreated its file but has not called RegisterRegion yet:
// the daemon notices at the next bind (decode SendMetadata) or Send
// (prefill) with one stat and fails the room with region_replaced instead
// of reading or writing the dead inode; registering then gives a new
// generation whose rooms succeed.
func TestReplacedFileNoticedWithoutRegisterFailsTheNextRoom(t *testing.T) {
	for _, side := range []string{"prefill", "decode"} {
		t.Run(side, func(t *testing.T) {
			p := startPair(t)
			pre, dec := registerRegions(t, p)
			deadDec := dec
			const room = 5
			src, dst := pages(0, 4), pages(20, 4)
			fillSource(pre, room, src, 1)
			if side == "prefill" {
				pre = recreate(t, pre)
				fillSource(pre, room, src, 1) // the restarted engine's new KV, never to be sent for this room
				openBound(t, p, room, dst, 3)
				_, err := p.prefill.Send(ctxT(t), &pb.SendRequest{RoomId: room, Pages: &pb.PageList{Indices: src}, Last: true, AuxIndex: 1})
				if status.Code(err) != codes.FailedPrecondition {
					t.Fatalf("Send with the region file replaced: %v, want FailedPrecondition", err)
				}
			} else {
				dec = recreate(t, dec)
				if _, err := p.prefill.OpenSender(ctxT(t), &pb.OpenSenderRequest{RoomId: room}); err != nil {
					t.Fatal(err)
				}
				if _, err := p.decode.OpenReceiver(ctxT(t), &pb.OpenReceiverRequest{RoomId: room, PrefillBootstrapAddr: p.bootstrap}); err != nil {
					t.Fatal(err)
				}
				_, err := p.decode.SendMetadata(ctxT(t), &pb.SendMetadataRequest{RoomId: room, DstPages: &pb.PageList{Indices: dst}, AuxIndex: 3})
				if status.Code(err) != codes.FailedPrecondition {
					t.Fatalf("SendMetadata with the region file replaced: %v, want FailedPrecondition", err)
				}
			}
			waitReplacedFailure(t, p, side, room)
			untouched(t, "dead decode inode", deadDec, dst, 3)
			untouched(t, "current decode file", dec, dst, 3)

			gen, _, _, _ := registerSide(t, p, side, map[string]region{"prefill": pre, "decode": dec}[side])
			if gen != 2 {
				t.Fatalf("register after the replacement: generation %d, want 2", gen)
			}
			runRoom(t, p, pre, dec, 6, pages(8, 4), pages(40, 4))
		})
	}
}

// UnregisterRegion with rooms in flight, on either side: they fail with
// region_replaced (the peer with aborted:remote), new rooms are refused
// FailedPrecondition "no region" as before registration, a repeat answers
// OK with unregistered false, and registering again is a new generation
// whose rooms succeed.
func TestUnregisterRegionFailsRoomsInFlightAndRefusesNewOnes(t *testing.T) {
	for _, side := range []string{"prefill", "decode"} {
		t.Run(side, func(t *testing.T) {
			p := startPair(t)
			pre, dec := registerRegions(t, p)
			for i, room := range []uint64{1, 2} {
				src := pages(int32(i)*4, 4)
				fillSource(pre, room, src, 0)
				openBound(t, p, room, pages(32+int32(i)*4, 4), uint32(i))
				if _, err := p.prefill.Send(ctxT(t), &pb.SendRequest{RoomId: room, Pages: &pb.PageList{Indices: src[:2]}}); err != nil {
					t.Fatal(err)
				}
			}
			unregister := func() (bool, uint64, uint32) {
				if side == "prefill" {
					r, err := p.prefill.UnregisterRegion(ctxT(t), &pb.PrefillServiceUnregisterRegionRequest{})
					if err != nil {
						t.Fatal(err)
					}
					return r.Unregistered, r.Generation, r.RoomsFailed
				}
				r, err := p.decode.UnregisterRegion(ctxT(t), &pb.DecodeServiceUnregisterRegionRequest{Rank: &pb.Rank{TpRank: 0, TpSize: 1}})
				if err != nil {
					t.Fatal(err)
				}
				return r.Unregistered, r.Generation, r.RoomsFailed
			}
			if ok, gen, failed := unregister(); !ok || gen != 1 || failed != 2 {
				t.Fatalf("UnregisterRegion: unregistered %v generation %d rooms_failed %d, want true 1 2", ok, gen, failed)
			}
			waitReplacedFailure(t, p, side, 1)
			waitReplacedFailure(t, p, side, 2)
			if ok, _, _ := unregister(); ok {
				t.Fatal("a repeated UnregisterRegion dropped a region again")
			}

			const room = 9
			if _, err := p.prefill.OpenSender(ctxT(t), &pb.OpenSenderRequest{RoomId: room}); err != nil {
				t.Fatal(err)
			}
			_, err := p.decode.OpenReceiver(ctxT(t), &pb.OpenReceiverRequest{RoomId: room, PrefillBootstrapAddr: p.bootstrap})
			if side == "decode" {
				if status.Code(err) != codes.FailedPrecondition {
					t.Fatalf("OpenReceiver with no region: %v, want FailedPrecondition", err)
				}
				if _, err := p.prefill.Abort(ctxT(t), &pb.PrefillServiceAbortRequest{RoomId: room}); err != nil {
					t.Fatal(err)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				if _, err := p.decode.SendMetadata(ctxT(t), &pb.SendMetadataRequest{RoomId: room, DstPages: &pb.PageList{Indices: pages(0, 2)}}); err != nil {
					t.Fatal(err)
				}
				_, err := p.prefill.Send(ctxT(t), &pb.SendRequest{RoomId: room, Pages: &pb.PageList{Indices: pages(0, 2)}, Last: true})
				if status.Code(err) != codes.FailedPrecondition {
					t.Fatalf("Send with no region: %v, want FailedPrecondition", err)
				}
			}

			r := map[string]region{"prefill": pre, "decode": dec}[side]
			if gen, _, _, _ := registerSide(t, p, side, r); gen != 2 {
				t.Fatalf("register after UnregisterRegion: generation %d, want 2", gen)
			}
			runRoom(t, p, pre, dec, 21, pages(16, 4), pages(8, 4))
		})
	}
}

// A region file truncated under its layout (its tail pages would fault)
// fails the next room with transfer_error on that side, the peer with
// aborted:remote naming it, and the daemon stays up: once the engine
// sizes the file again, rooms succeed.
func TestTruncatedRegionFileFailsTheRoomAndTheDaemonStaysUp(t *testing.T) {
	for _, side := range []string{"prefill", "decode"} {
		t.Run(side, func(t *testing.T) {
			p := startPair(t)
			pre, dec := registerRegions(t, p)
			target := map[string]region{"prefill": pre, "decode": dec}[side]
			if err := os.Truncate(target.path, target.layout.Size()/2); err != nil {
				t.Fatal(err)
			}
			const room = 5
			src, dst := pages(0, 2), pages(2, 2)
			if _, err := p.prefill.OpenSender(ctxT(t), &pb.OpenSenderRequest{RoomId: room}); err != nil {
				t.Fatal(err)
			}
			if _, err := p.decode.OpenReceiver(ctxT(t), &pb.OpenReceiverRequest{RoomId: room, PrefillBootstrapAddr: p.bootstrap}); err != nil {
				t.Fatal(err)
			}
			_, err := p.decode.SendMetadata(ctxT(t), &pb.SendMetadataRequest{RoomId: room, DstPages: &pb.PageList{Indices: dst}})
			if side == "prefill" {
				if err != nil {
					t.Fatal(err)
				}
				eventually(t, "prefill WaitingForInput", func() bool {
					ps, _ := pollState(t, p, room)
					return ps.State == pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT
				})
				_, err = p.prefill.Send(ctxT(t), &pb.SendRequest{RoomId: room, Pages: &pb.PageList{Indices: src}, Last: true})
			}
			if status.Code(err) != codes.FailedPrecondition {
				t.Fatalf("%s call with its region file truncated: %v, want FailedPrecondition", side, err)
			}
			eventually(t, "room failed transfer_error", func() bool {
				ps, ds := pollState(t, p, room)
				own, peer := ps, ds
				if side == "decode" {
					own, peer = ds, ps
				}
				return own.State == pb.RoomState_ROOM_STATE_FAILED && own.Reason == "transfer_error" &&
					peer.State == pb.RoomState_ROOM_STATE_FAILED && peer.PeerReason == "transfer_error"
			})
			if err := os.Truncate(target.path, target.layout.Size()); err != nil {
				t.Fatal(err)
			}
			runRoom(t, p, pre, dec, 6, pages(8, 4), pages(40, 4))
		})
	}
}
