package service

import (
	"bytes"
	"fmt"
	"strconv"
	"testing"

	"google.golang.org/grpc/codes"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
)

// kvRoom is a bound room of the 4-buffer test region: src[k] is the
// source page and dst[k] the destination page of position k.
type kvRoom struct {
	t        *testing.T
	p        *pair
	pre, dec region
	id       uint64
	src, dst []int32
}

// bindKV fills every source page with a pattern of its buffer and
// position, decode's destination pages with 0xAB, and binds the room with
// the given prefix.
func bindKV(t *testing.T, p *pair, pre, dec region, id uint64, src, dst []int32, prefix uint32) *kvRoom {
	t.Helper()
	for b := range pre.layout.Buffers {
		for k := range src {
			page := pre.mem.Pages(b, pageRun(src[k]))
			for j := range page {
				page[j] = byte(int(id) + b*37 + k*11 + j)
			}
			copy(page, fmt.Sprintf("b%d k%d", b, k))
			copy(dec.mem.Pages(b, pageRun(dst[k])), bytes.Repeat([]byte{0xAB}, len(page)))
		}
	}
	openBoth(t, p, id)
	if _, err := p.decode.SendMetadata(ctxT(t), &pb.SendMetadataRequest{RoomId: id, DstPages: &pb.PageList{Indices: dst}, AuxIndex: 3, PrefixLen: prefix}); err != nil {
		t.Fatal(err)
	}
	waitState(t, "prefill WaitingForInput", prePoll(t, p, id), pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT)
	return &kvRoom{t: t, p: p, pre: pre, dec: dec, id: id, src: src, dst: dst}
}

// send is a Send of positions [from, to) in buffers (nil: all).
func (r *kvRoom) send(from, to int, buffers []uint32, last bool) error {
	req := &pb.SendRequest{RoomId: r.id, StartPosition: uint32(from), Buffers: buffers, Last: last, AuxIndex: 2}
	if to > from {
		req.Pages = &pb.PageList{Indices: r.src[from:to]}
	}
	_, err := r.p.prefill.Send(ctxT(r.t), req)
	return err
}

// landed reports whether buffer b's position k in decode's region holds
// its source page.
func (r *kvRoom) landed(b, k int) bool {
	return bytes.Equal(r.dec.mem.Pages(b, pageRun(r.dst[k])), r.pre.mem.Pages(b, pageRun(r.src[k])))
}

// untouched reports whether buffer b's position k in decode's region still
// holds the 0xAB it was filled with.
func (r *kvRoom) untouched(b, k int) bool {
	page := r.dec.mem.Pages(b, pageRun(r.dst[k]))
	return bytes.Count(page, []byte{0xAB}) == len(page)
}

func (r *kvRoom) mustSend(t *testing.T, from, to int, buffers []uint32, last bool) {
	t.Helper()
	if err := r.send(from, to, buffers, last); err != nil {
		t.Fatalf("Send positions %d..%d of buffers %v (last %v): %v", from, to, buffers, last, err)
	}
}

// A layer-wise room: each buffer has its own next position, and a
// position counts as sent only when every buffer has it: a Send of all
// buffers from a position one buffer has not reached is refused, and so is
// a last Send while one buffer lacks positions; decode is not done until
// every buffer has every position.
func TestPositionCountsAsSentWhenEveryBufferHasIt(t *testing.T) {
	p := startQuickPair(t)
	pre, dec := registerRegions(t, p)
	r := bindKV(t, p, pre, dec, 71, []int32{3, 4, 5, 6}, []int32{40, 41, 42, 43}, 0)

	r.mustSend(t, 0, 4, []uint32{0, 1}, false)
	r.mustSend(t, 0, 2, []uint32{2}, false)
	wantField(t, r.send(2, 4, nil, false), "start_position") // buffer 0 is at 4, 2 at 2, 3 at 0
	err := r.send(0, 4, []uint32{3}, true)
	wantField(t, err, "last")
	wantCode(t, err, codes.InvalidArgument, "buffer 2")
	eventually(t, "buffers 0 and 1 complete, buffer 2 at positions 0-1 in decode's region", func() bool {
		for k := range 4 {
			if !r.landed(0, k) || !r.landed(1, k) || k < 2 && !r.landed(2, k) {
				return false
			}
		}
		return true
	})
	if _, ds := pollState(t, p, r.id); ds.State == pb.RoomState_ROOM_STATE_SUCCESS {
		t.Fatal("decode Success while buffers 2 and 3 lack positions")
	}
	for k := 2; k < 4; k++ {
		if !r.untouched(2, k) {
			t.Fatalf("buffer 2 position %d written before it was sent", k)
		}
	}
	r.mustSend(t, 2, 4, []uint32{2}, false)
	r.mustSend(t, 0, 4, []uint32{3}, true)
	waitBothSuccess(t, p, r.id)
	for b := range 4 {
		for k := range 4 {
			if !r.landed(b, k) {
				t.Fatalf("buffer %d position %d differs from its source", b, k)
			}
		}
	}
}

// Layer-wise chunked prefill: for each chunk, each layer's K and V
// buffers are sent as soon as that layer ran; every byte of every buffer
// arrives where it belongs and the aux row with the last Send.
func TestLayerWiseSendsDeliverEveryBuffer(t *testing.T) {
	p := startQuickPair(t)
	pre, dec := registerRegions(t, p)
	src := []int32{9, 8, 7, 20, 21, 22}
	dst := []int32{1, 2, 3, 50, 51, 52}
	r := bindKV(t, p, pre, dec, 72, src, dst, 0)
	copy(pre.mem.AuxRow(2), "first-token:layerwise")
	chunks := [][2]int{{0, 3}, {3, 6}}
	layers := [][]uint32{{0, 1}, {2, 3}} // K and V of each layer
	for c, ch := range chunks {
		for l, kv := range layers {
			r.mustSend(t, ch[0], ch[1], kv, c == len(chunks)-1 && l == len(layers)-1)
		}
	}
	waitBothSuccess(t, p, r.id)
	for b := range 4 {
		for k := range src {
			if !r.landed(b, k) {
				t.Fatalf("buffer %d position %d differs from its source", b, k)
			}
		}
	}
	if got := string(dec.mem.AuxRow(3)[:21]); got != "first-token:layerwise" {
		t.Fatalf("aux row %q", got)
	}
}

// wantOnlyAbovePrefix checks every buffer of the room: positions below
// prefix untouched, every byte of those above its source's.
func (r *kvRoom) wantOnlyAbovePrefix(t *testing.T, prefix int) {
	t.Helper()
	for b := range 4 {
		for k := range r.dst {
			if k < prefix && !r.untouched(b, k) {
				t.Fatalf("room %d buffer %d position %d, inside the prefix, was written", r.id, b, k)
			}
			if k >= prefix && !r.landed(b, k) {
				t.Fatalf("room %d buffer %d position %d differs from its source", r.id, b, k)
			}
		}
	}
}

// With prefix_len 2, decode's first two positions are never written in
// any buffer and every byte above them is the source's, whether prefill
// sends every position (the pages below the prefix are accepted and
// skipped) or starts at the prefix as SGLang's prefill does; only the
// bytes above the prefix move (both daemons' byte counters). A room whose
// prefix is every position completes with a last Send of no pages.
func TestPrefixPositionsMoveNoBytes(t *testing.T) {
	p := startQuickPair(t)
	pre, dec := registerRegions(t, p)
	const prefix = 2
	all := bindKV(t, p, pre, dec, 73, []int32{10, 11, 12, 13, 14, 15}, []int32{30, 31, 32, 33, 34, 35}, prefix)
	all.mustSend(t, 0, 1, nil, false) // inside the prefix: nothing moves
	all.mustSend(t, 1, 4, nil, false) // straddles it
	all.mustSend(t, 4, 6, nil, true)
	skips := bindKV(t, p, pre, dec, 74, []int32{16, 17, 18, 19}, []int32{36, 37, 38, 39}, prefix)
	wantField(t, skips.send(3, 4, nil, false), "start_position") // past the prefix: positions 2 missing
	skips.mustSend(t, prefix, 4, nil, true)
	waitBothSuccess(t, p, all.id, skips.id)
	all.wantOnlyAbovePrefix(t, prefix)
	skips.wantOnlyAbovePrefix(t, prefix)
	want := strconv.Itoa((6 - prefix + 4 - prefix) * 4 * 4096)
	for _, side := range []struct{ base, label string }{{p.decHTTP, "decode"}, {p.preHTTP, "prefill"}} {
		if got := metric(t, side.base, `pdlink_transfer_bytes_total{side="`+side.label+`"}`); got != want {
			t.Errorf("%s moved %s bytes, want %s (positions above the prefix only)", side.label, got, want)
		}
	}

	full := bindKV(t, p, pre, dec, 75, []int32{20, 21}, []int32{40, 41}, 2)
	copy(pre.mem.AuxRow(2), "first-token:fullhit")
	full.mustSend(t, 2, 2, nil, true)
	waitBothSuccess(t, p, full.id)
	full.wantOnlyAbovePrefix(t, 2)
	if got := string(dec.mem.AuxRow(3)[:19]); got != "first-token:fullhit" {
		t.Fatalf("full prefix: aux row %q", got)
	}
}

// buffers is checked once, at the edge: each in range and named once; an
// empty page list is only for a last Send.
func TestSendBuffersAreValidatedAtTheEdge(t *testing.T) {
	p := startQuickPair(t)
	pre, dec := registerRegions(t, p)
	r := bindKV(t, p, pre, dec, 77, []int32{1, 2}, []int32{3, 4}, 0)
	wantField(t, r.send(0, 2, []uint32{4}, false), "buffers[0]")
	wantField(t, r.send(0, 2, []uint32{1, 3, 1}, false), "buffers[2]")
	wantField(t, r.send(0, 0, nil, false), "pages")
	// Naming every buffer is the same as naming none: one counter.
	r.mustSend(t, 0, 1, []uint32{3, 2, 1, 0}, false)
	r.mustSend(t, 1, 2, nil, true)
	waitBothSuccess(t, p, r.id)
}

// prefix_len is checked at decode's edge against dst_pages, and a retry
// of SendMetadata with another prefix_len is another request.
func TestSendMetadataPrefixLenIsValidatedAtTheEdge(t *testing.T) {
	p := startQuickPair(t)
	registerRegions(t, p)
	const room = 76
	openBoth(t, p, room)
	dst := &pb.PageList{Runs: []*pb.PageRun{{Start: 4, Count: 3}}}
	_, err := p.decode.SendMetadata(ctxT(t), &pb.SendMetadataRequest{RoomId: room, DstPages: dst, PrefixLen: 4})
	wantField(t, err, "prefix_len")
	if _, err := p.decode.SendMetadata(ctxT(t), &pb.SendMetadataRequest{RoomId: room, DstPages: dst, PrefixLen: 3}); err != nil {
		t.Fatalf("prefix_len equal to the page count: %v", err)
	}
	_, err = p.decode.SendMetadata(ctxT(t), &pb.SendMetadataRequest{RoomId: room, DstPages: dst, PrefixLen: 1})
	wantCode(t, err, codes.AlreadyExists, "prefix_len")
}
