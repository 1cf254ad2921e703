package service

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/room"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// frameCutDialer is prefilld's data-plane dialer in a test: TCP, and once armed, the
// armed func runs (once) just before the next write that starts a frame matching match,
// on whichever connection writes it. It counts dials.
type frameCutDialer struct {
	match func(transfer.Header) bool
	mu    sync.Mutex
	cut   func()
	dials atomic.Int32
}

// arm makes cut run before the next matching frame.
func (d *frameCutDialer) arm(cut func()) {
	d.mu.Lock()
	d.cut = cut
	d.mu.Unlock()
}

func (d *frameCutDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	d.dials.Add(1)
	return &frameCutConn{Conn: c, d: d}, nil
}

type frameCutConn struct {
	net.Conn
	d *frameCutDialer
}

// Write runs the armed cut before a write that starts with a matching frame header (each
// frame's first write does: a wrapped connection gets net.Buffers one slice at a time).
func (c *frameCutConn) Write(p []byte) (int, error) {
	if len(p) >= transfer.HeaderSize {
		if h, err := transfer.DecodeHeader(p[:transfer.HeaderSize]); err == nil && c.d.match(h) {
			c.d.mu.Lock()
			cut := c.d.cut
			c.d.cut = nil
			c.d.mu.Unlock()
			if cut != nil {
				cut()
			}
		}
	}
	return c.Conn.Write(p)
}

// lastPage is where the last page of l's last buffer starts: a file cut there is short
// for prefill's layout, for the offer's size and for decode's stat of the source (which
// knows its buffers, not its aux rows), and no page a room here reads is past its end.
func lastPage(l transfer.Layout) int64 {
	b := l.Buffers[len(l.Buffers)-1]
	return b.Offset + b.Length - b.ItemLen
}

// sampleOrZero is metricValue, or 0 when the daemon exports no such sample.
func sampleOrZero(t *testing.T, base, prefix string) float64 {
	t.Helper()
	for _, line := range strings.Split(httpGet(t, base+"/metrics"), "\n") {
		if strings.HasPrefix(line, prefix) {
			v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			if err != nil {
				t.Fatalf("sample %s: %v", prefix, err)
			}
			return v
		}
	}
	return 0
}

// metricValue is metric's sample as a number.
func metricValue(t *testing.T, base, prefix string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(metric(t, base, prefix), 64)
	if err != nil {
		t.Fatalf("sample %s: %v", prefix, err)
	}
	return v
}

// #26 item 1: a prefill region file cut below its layout while the same-host path serves
// it, then put back to its size (the same inode) and registered again, serves again on
// that path. The file is cut at its last page, so no page a room reads is past its end and
// nothing faults: what is under test is what the two daemons remember of the short file.
// It is cut on the data connection's first shm chunk (decode's stat finds it short and
// keeps the offer as gone) or on its first offer (decode refuses it, identity). The room
// of that moment fails transfer_error (under auto a refused offer sends it by TCP
// instead: Success), a room sent while the file is short fails transfer_error at
// prefill's Send, and once the engine registers the whole file again a new room is
// Success with its bytes checked and every byte of it copied by decode from the prefill
// mapping, on the same connection, after one re-offer. It used to stay gone or refused
// for the connection's life: under shm every new room failed ("region file smaller
// than layout" on decode, "same-host pages refused by the peer" on prefill), and under
// auto the rank stayed on TCP.
func TestTruncatedPrefillFileRestoredAndRegisteredAgainServesSameHost(t *testing.T) {
	for _, at := range []struct {
		name  string
		match func(transfer.Header) bool
	}{
		{"chunk", func(h transfer.Header) bool { return h.Type == transfer.FrameChunk && h.Flags&transfer.FlagShm != 0 }},
		{"offer", func(h transfer.Header) bool { return h.Type == transfer.FrameShmOffer }},
	} {
		for _, kind := range []transfer.Kind{transfer.KindShm, transfer.KindAuto} {
			t.Run(at.name+"/"+string(kind), func(t *testing.T) { restoredPrefillFileServes(t, kind, at.name == "offer", at.match) })
		}
	}
}

func restoredPrefillFileServes(t *testing.T, kind transfer.Kind, atOffer bool, match func(transfer.Header) bool) {
	d := &frameCutDialer{match: match}
	prefillHook = func(c *room.PrefillConfig) { c.Sender.ConnsPerPeer, c.Sender.Dialer = 1, d }
	t.Cleanup(func() { prefillHook = nil })
	p := startPairWith(t, onTransport(kind))
	pre, dec := registerRegions(t, p)
	d.arm(func() {
		if err := os.Truncate(pre.path, lastPage(pre.layout)); err != nil {
			t.Error(err)
		}
	})

	// The room of the moment the file is cut.
	src, dst := pages(0, 4), pages(8, 4)
	fillSource(pre, 1, src, 1)
	openBound(t, p, 1, dst, 6)
	_, err := p.prefill.Send(ctxT(t), &pb.SendRequest{RoomId: 1, Pages: &pb.PageList{Indices: src}, Last: true, AuxIndex: 1})
	if err != nil && status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("last Send of the room the file is cut under: %v", err)
	}
	if atOffer && kind == transfer.KindAuto {
		waitBothSuccess(t, p, 1) // refused, so by TCP
		// Its pages only: the source aux rows are past the cut (the room copied its row
		// at Send, before the cut).
		for b := range pre.layout.Buffers {
			for i := range src {
				if string(pre.mem.Pages(b, transfer.Run{Start: src[i], Count: 1})) != string(dec.mem.Pages(b, transfer.Run{Start: dst[i], Count: 1})) {
					t.Fatalf("room 1 by TCP: buffer %d decode page %d differs from source page %d", b, dst[i], src[i])
				}
			}
		}
	} else {
		waitTransferError(t, p, 1)
	}

	// A room sent while the file is short.
	openBound(t, p, 2, pages(12, 4), 5)
	_, err = p.prefill.Send(ctxT(t), &pb.SendRequest{RoomId: 2, Pages: &pb.PageList{Indices: pages(4, 4)}, Last: true, AuxIndex: 2})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Send with the region file short: %v, want FailedPrecondition", err)
	}
	waitTransferError(t, p, 2)

	// The engine puts the file back and registers it again: the same file, generation 1.
	if err := os.Truncate(pre.path, pre.layout.Size()); err != nil {
		t.Fatal(err)
	}
	if gen, _, _, _ := registerSide(t, p, "prefill", pre); gen != 1 {
		t.Fatalf("register of the restored file: generation %d, want 1 (the same file)", gen)
	}
	copied := metricValue(t, p.decHTTP, `pdlink_shm_copied_bytes_total{side="decode"}`)
	reoffers := sampleOrZero(t, p.preHTTP, `pdlink_shm_reoffers_total{side="prefill"}`) // read strictly below, after the room's own checks
	src3, dst3 := pages(16, 4), pages(24, 4)
	runRoom(t, p, pre, dec, 3, src3, dst3)
	want := float64(len(src3)) * float64(len(pre.layout.Buffers)) * float64(pre.layout.Buffers[0].ItemLen)
	if got := metricValue(t, p.decHTTP, `pdlink_shm_copied_bytes_total{side="decode"}`) - copied; got != want {
		t.Fatalf("room after the file was registered again: %v bytes copied from the prefill mapping, want %v (the rank stayed off the same-host path)", got, want)
	}
	if got := metricValue(t, p.preHTTP, `pdlink_shm_reoffers_total{side="prefill"}`) - reoffers; got != 1 {
		t.Fatalf("pdlink_shm_reoffers_total rose by %v, want 1", got)
	}
	if n := d.dials.Load(); n != 1 {
		t.Fatalf("%d data connections dialed: the one that met the short file must serve again, not a new one", n)
	}
	first := pb.RoomState_ROOM_STATE_FAILED
	if atOffer && kind == transfer.KindAuto {
		first = pb.RoomState_ROOM_STATE_SUCCESS
	}
	for r, want := range map[uint64]pb.RoomState{1: first, 2: pb.RoomState_ROOM_STATE_FAILED} {
		if ps, ds := pollState(t, p, r); ps.State != want || ds.State != want {
			t.Fatalf("room %d moved on: prefill %v, decode %v, want %v", r, ps.State, ds.State, want)
		}
	}
}

// waitTransferError waits for room to be Failed on both sides with transfer_error, its
// own reason on one side and the other side's (peer_reason, or its own when both saw
// it), and fails the test at once if either side shows Success.
func waitTransferError(t *testing.T, p *pair, r uint64) {
	t.Helper()
	const te = "transfer_error"
	eventually(t, fmt.Sprintf("room %d Failed transfer_error on both sides", r), func() bool {
		ps, ds := pollState(t, p, r)
		if ps.State == pb.RoomState_ROOM_STATE_SUCCESS || ds.State == pb.RoomState_ROOM_STATE_SUCCESS {
			t.Fatalf("room %d reached Success with the region file short: prefill %s; decode %s", r, statusLine(ps), statusLine(ds))
		}
		failed := ps.State == pb.RoomState_ROOM_STATE_FAILED && ds.State == pb.RoomState_ROOM_STATE_FAILED
		names := func(s *pb.RoomStatus) bool { return s.Reason == te || s.PeerReason == te }
		return failed && (ps.Reason == te || ds.Reason == te) && names(ps) && names(ds)
	})
}
