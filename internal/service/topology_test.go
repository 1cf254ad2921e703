package service

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/rankmap"
	"github.com/pdlink/pdlink/pkg/room"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// The layouts of these tests: 4 buffers of 64 pages of 4096 bytes and 8 aux rows of 64
// bytes, as newRegion, each page described as tokens x heads x head bytes.
func describedRegion(t *testing.T, tokens, heads, headBytes int64) region {
	t.Helper()
	return newRegionWithLayout(t, transfer.UniformLayout(4, 64, 4096, 8, 64).WithHeads(rankmap.MHA, tokens, heads, headBytes))
}

// startObservedPair is startPair with the daemons' warnings also kept for the test to read.
func startObservedPair(t *testing.T) (*pair, *observer.ObservedLogs) {
	core, logs := observer.New(zapcore.WarnLevel)
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel), zaptest.WrapOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewTee(c, core)
	})))
	return startPairLoggingTo(t, log, nil), logs
}

func debugPeers(t *testing.T, base string) []room.PeerPlan {
	t.Helper()
	var d struct {
		Peers []room.PeerPlan `json:"peers"`
	}
	if err := json.Unmarshal([]byte(httpGet(t, base+"/debug/rooms")), &d); err != nil {
		t.Fatal(err)
	}
	return d.Peers
}

// bindRoom opens room on both daemons and sends decode's METADATA for pages dst.
func bindRoom(t *testing.T, p *pair, roomID uint64, dst []int32) {
	t.Helper()
	if _, err := p.prefill.OpenSender(ctxT(t), &pb.OpenSenderRequest{RoomId: roomID}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.decode.OpenReceiver(ctxT(t), &pb.OpenReceiverRequest{RoomId: roomID, PrefillBootstrapAddr: p.bootstrap}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.decode.SendMetadata(ctxT(t), &pb.SendMetadataRequest{RoomId: roomID, DstPages: &pb.PageList{Indices: dst}, AuxIndex: 1}); err != nil {
		t.Fatal(err)
	}
}

// TestDecodePeerWhoseHeadsCannotMapIsRefusedWithTheRankmapReason: the page bytes are equal
// (the opaque comparison would let them through), but the described shapes cannot map:
// every room bound to the peer fails with reason invalid, the refusal is logged with
// pkg/rankmap's sentinel, counted once by reason and shown in /debug/rooms.
func TestDecodePeerWhoseHeadsCannotMapIsRefusedWithTheRankmapReason(t *testing.T) {
	for _, c := range []struct {
		name              string
		tokens, heads, hb int64 // decode's page: 4096 bytes like prefill's 16 x 2 x 128
		reason            string
		sentinel          error
	}{
		{"head bytes", 16, 4, 64, "dtype", rankmap.ErrDtypeMismatch},
		{"page tokens", 32, 1, 128, "page_size", rankmap.ErrPageSizeMismatch},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, logs := startObservedPair(t)
			pre, dec := describedRegion(t, 16, 2, 128), describedRegion(t, c.tokens, c.heads, c.hb)
			registerRegion(t, p, pre, dec)
			series := fmt.Sprintf(`pdlink_peer_layout_refused_total{reason=%q,side="prefill"}`, c.reason)
			if got := metric(t, p.preHTTP, series); got != "0" {
				t.Fatalf("%s is %s before any bind", series, got)
			}
			for roomID := uint64(1); roomID <= 2; roomID++ {
				bindRoom(t, p, roomID, []int32{1, 2})
				eventually(t, "the room failed as invalid on prefill", func() bool {
					ps, _ := pollState(t, p, roomID)
					return ps.State == pb.RoomState_ROOM_STATE_FAILED && ps.Reason == "invalid"
				})
			}
			if got := metric(t, p.preHTTP, series); got != "1" {
				t.Errorf("%s is %s after two rooms with one refused peer, want 1 (once per pair of layouts)", series, got)
			}
			refused := logs.FilterMessage("decode peer layout refused").All()
			if len(refused) != 1 {
				t.Fatalf("%d refusal log lines, want 1", len(refused))
			}
			fields := refused[0].ContextMap()
			if fields["reason"] != c.reason || !strings.Contains(fmt.Sprint(fields["error"]), c.sentinel.Error()) {
				t.Errorf("refusal logged with %v, want reason %s and %q", fields, c.reason, c.sentinel)
			}
			peers := debugPeers(t, p.preHTTP)
			if len(peers) != 1 || peers[0].Refused != c.reason || !strings.Contains(peers[0].Error, c.sentinel.Error()) {
				t.Errorf("/debug/rooms peers %+v, want the one refused for %s", peers, c.reason)
			}
		})
	}
}

// TestEqualDescribedLayoutsBindAndMoveVerifiedBytes: described layouts that map (equal
// shape, TP 1) bind as the identity and every byte arrives.
func TestEqualDescribedLayoutsBindAndMoveVerifiedBytes(t *testing.T) {
	p := startPair(t)
	pre, dec := describedRegion(t, 16, 2, 128), describedRegion(t, 16, 2, 128)
	registerRegion(t, p, pre, dec)
	const roomID = 7
	src, dst := []int32{3, 4, 9}, []int32{60, 5, 6}
	for b := range pre.layout.Buffers {
		for i, pg := range src {
			page := pre.mem.Pages(b, transfer.Run{Start: pg, Count: 1})
			for j := range page {
				page[j] = byte(b*13 + i*5 + j*3)
			}
		}
	}
	copy(pre.mem.AuxRow(2), "described")
	bindRoom(t, p, roomID, dst)
	eventually(t, "prefill WaitingForInput", func() bool {
		ps, _ := pollState(t, p, roomID)
		return ps.State == pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT
	})
	if _, err := p.prefill.Send(ctxT(t), &pb.SendRequest{RoomId: roomID, Pages: &pb.PageList{Indices: src}, Last: true, AuxIndex: 2}); err != nil {
		t.Fatal(err)
	}
	waitBothSuccess(t, p, roomID)
	for b := range dec.layout.Buffers {
		for i, pg := range dst {
			want := pre.mem.Pages(b, transfer.Run{Start: src[i], Count: 1})
			if got := dec.mem.Pages(b, transfer.Run{Start: pg, Count: 1}); string(got) != string(want) {
				t.Fatalf("buffer %d page %d differs from source page %d", b, pg, src[i])
			}
		}
	}
	if got := string(dec.mem.AuxRow(1)[:len("described")]); got != "described" {
		t.Fatalf("aux row %q", got)
	}
	peers := debugPeers(t, p.preHTTP)
	if len(peers) != 1 || !peers[0].Described || !peers[0].Identity || peers[0].Refused != "" {
		t.Errorf("/debug/rooms peers %+v, want one described identity mapping", peers)
	}
	for _, r := range room.PeerLayoutRefusalReasons() {
		if got := metric(t, p.preHTTP, fmt.Sprintf(`pdlink_peer_layout_refused_total{reason=%q,side="prefill"}`, r)); got != "0" {
			t.Errorf("refused for %s: %s, want 0", r, got)
		}
	}
}

func registerRegion(t *testing.T, p *pair, pre, dec region) {
	t.Helper()
	if _, err := p.prefill.RegisterRegion(ctxT(t), &pb.PrefillServiceRegisterRegionRequest{RegionPath: pre.path, Layout: layoutPB(pre.layout)}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.decode.RegisterRegion(ctxT(t), &pb.DecodeServiceRegisterRegionRequest{RegionPath: dec.path, Layout: layoutPB(dec.layout)}); err != nil {
		t.Fatal(err)
	}
}

// TestRegisterRegionNamesTheInconsistentHeadField: a described layout whose head fields
// disagree is InvalidArgument naming the field, on either daemon.
func TestRegisterRegionNamesTheInconsistentHeadField(t *testing.T) {
	p := startPair(t)
	r := describedRegion(t, 16, 2, 128)
	bad := layoutPB(r.layout)
	bad.Buffers[2].PageTokens = 8 // 8 x 2 x 128 is not the 4096-byte page
	_, err := p.prefill.RegisterRegion(ctxT(t), &pb.PrefillServiceRegisterRegionRequest{RegionPath: r.path, Layout: bad})
	wantField(t, err, "layout.buffers[2].item_len")
	bad = layoutPB(r.layout)
	bad.Buffers[0].RankHeads = 1
	bad.Buffers[0].HeadBytes = 256
	_, err = p.decode.RegisterRegion(ctxT(t), &pb.DecodeServiceRegisterRegionRequest{RegionPath: r.path, Layout: bad})
	wantField(t, err, "layout.buffers[0].rank_heads")
}
