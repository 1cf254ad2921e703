package transfer

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pdlink/pdlink/pkg/rankmap"
)

// halfRows are head slices on a layout of 4096-byte pages seen as 64 rows of 64 bytes:
// in every row the first 32 bytes, at the same place, on both buffers. Enough to make a
// stream sliced on layouts of equal TP, beside whole-page streams of the same region.
var halfRows = []rankmap.Copy{
	{Buffer: 0, Heads: 1, HeadBytes: 32, PageTokens: 64, SrcRow: 64, DstRow: 64},
	{Buffer: 1, Heads: 1, HeadBytes: 32, PageTokens: 64, SrcRow: 64, DstRow: 64},
}

// capRig is a sender and a receiver on one host whose receiver answers offers with caps
// (0: as the build before head slices went by shared memory), the sender's log kept.
func capRig(t *testing.T, send Kind, caps ShmCaps) (*rig, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zapcore.InfoLevel)
	l := UniformLayout(2, 64, 4096, 4, 64)
	g := newRig(t, l, l, true, SenderConfig{Transport: send, ConnsPerPeer: 1, Logger: zap.New(core)}, ReceiverConfig{Transport: KindAuto})
	g.rcv.shmCaps.Store(uint32(caps))
	for b := range 2 {
		fill(g.src.Buffer(b), uint64(b+1))
		memset(g.dst.Buffer(b), 0xAA)
	}
	return g, logs
}

// sendSliced expects and sends a stream of halfRows over pages [start, start+4) of both
// buffers under room.
func (g *rig) sendSliced(t *testing.T, room uint64, start int32) chan error {
	t.Helper()
	k := Key{Room: room, Nonce: 1, From: Rank{Size: 1}}
	pages := SamePages(2, []Run{{start, 4}})
	if err := g.rcv.Expect(Expectation{Key: k, Dst: pages, AuxRow: -1, Copies: halfRows}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	if err := g.snd.Send(t.Context(), SendRequest{Peer: g.addr, Key: k, Src: pages, Dst: pages, Copies: halfRows,
		Done: func(err error) { done <- err }}); err != nil {
		t.Fatal(err)
	}
	return done
}

// wantHalfRows checks pages [start, start+4): the first half of every row is the source's,
// the second half untouched.
func (g *rig) wantHalfRows(t *testing.T, start int32) {
	t.Helper()
	for b := range 2 {
		src, dst := g.src.Pages(b, Run{start, 4}), g.dst.Pages(b, Run{start, 4})
		for row := 0; row < len(dst); row += 64 {
			if !bytes.Equal(dst[row:row+32], src[row:row+32]) || !bytes.Equal(dst[row+32:row+64], bytes.Repeat([]byte{0xAA}, 32)) {
				t.Fatalf("buffer %d row %d: want the source's first half and the rest untouched", b, row/64)
			}
		}
	}
}

// A new prefilld beside a decoded of the build before head slices went by shared memory
// (it accepts offers, refuses a FlagShm|FlagSliced chunk as malformed, and answers without
// ShmCapSlices): the sliced streams go by tcp on the same connection and land, logged once
// for the connection and rank and counted as the no_slices fallback, while whole-page
// rooms on the same connection still copy by shared memory.
func TestShmSlicedStreamGoesByTCPWhenDecodeAnswersWithoutSlices(t *testing.T) {
	g, logs := capRig(t, KindAuto, 0)
	for room := range uint64(2) {
		if err := waitDone(t, g.sendSliced(t, 10+room, int32(8*room))); err != nil {
			t.Fatalf("sliced room %d: %v", room, err)
		}
		g.wantHalfRows(t, int32(8*room))
	}
	if n := g.rcv.ShmStats().CopiedBytes; n != 0 {
		t.Fatalf("decode copied %d bytes of sliced streams by shared memory, want them all by tcp", n)
	}
	whole := Key{Room: 20, Nonce: 1}
	pages := SamePages(2, []Run{{32, 4}})
	if err := waitDone(t, g.expectSend(t, whole, pages, pages, nil, -1)); err != nil {
		t.Fatal(err)
	}
	equalPages(t, g, pages, pages)
	ss := g.snd.ShmStats()
	if got := g.rcv.ShmStats().CopiedBytes; got != 2*4*4096 {
		t.Fatalf("decode copied %d bytes by shared memory, want the whole-page room's %d", got, 2*4*4096)
	}
	if ss.Accepted != 1 || ss.Fallbacks[ShmNoSlices.String()] != 1 || ss.ShmConns != 1 {
		t.Fatalf("sender stats %+v; want 1 accepted offer, 1 no_slices fallback, 1 shm connection", ss)
	}
	lines := logs.FilterMessage("same-host head slices not copied by the peer, tcp for this rank's sliced streams").All()
	if len(lines) != 1 || lines[0].Level != zapcore.WarnLevel || lines[0].ContextMap()["reason"] != "no_slices" {
		t.Fatalf("fallback lines %v, want one warning with reason no_slices", lines)
	}
}

// Against this build's decode the sliced stream goes by shared memory (the control for
// the test above: the answer's bit, not the layout, decides).
func TestShmSlicedStreamUsesShmWhenDecodeAnswersWithSlices(t *testing.T) {
	for _, c := range []struct {
		name string
		caps ShmCaps
	}{{"this build", shmCapsBuilt}, {"a later build's extra bits", ^ShmCaps(0)}} {
		t.Run(c.name, func(t *testing.T) {
			g, _ := capRig(t, KindAuto, c.caps)
			if err := waitDone(t, g.sendSliced(t, 10, 0)); err != nil {
				t.Fatal(err)
			}
			g.wantHalfRows(t, 0)
			if got, want := g.rcv.ShmStats().CopiedBytes, uint64(2*4*2048); got != want {
				t.Fatalf("decode copied %d bytes by shared memory, want the slices' %d", got, want)
			}
			if n := g.snd.ShmStats().Fallbacks[ShmNoSlices.String()]; n != 0 {
				t.Fatalf("%d no_slices fallbacks, want 0", n)
			}
		})
	}
}

// Under --data-transport=shm the peer that cannot copy head slices fails the sliced
// stream (ErrShmRefused, transfer_error), as a refused offer does: shm never runs over tcp.
func TestShmOnlySlicedStreamFailsWhenDecodeAnswersWithoutSlices(t *testing.T) {
	g, _ := capRig(t, KindShm, 0)
	err := waitDone(t, g.sendSliced(t, 10, 0))
	if !errors.Is(err, ErrShmRefused) || ReasonOf(err) != ReasonTransferError {
		t.Fatalf("outcome %v, want transfer_error from ErrShmRefused", err)
	}
	if !untouched0xAA(g.dst.Buffer(0)) {
		t.Fatal("a byte of the refused stream landed")
	}
}

func untouched0xAA(b []byte) bool { return bytes.Equal(b, bytes.Repeat([]byte{0xAA}, len(b))) }

// The SHM_ANSWER's caps, byte for byte: this build's accepted answer sets bit 0 of the
// pages field (bytes 36-39), which the previous build writes zero and never reads.
func TestShmAnswerCapsWireBytes(t *testing.T) {
	h := Header{Type: FrameShmAnswer, Rank: Rank{TP: 1, Size: 2}, Seq: 3, Pages: uint32(ShmCapSlices)}
	var b [HeaderSize]byte
	h.Encode(b[:])
	const want = "50444b56030700000000000000000000000000000000000003000000000000000000000001000000" +
		"0100020000000000000000000000000000000000"
	if got := hex.EncodeToString(b[:60]); got != want {
		t.Fatalf("answer bytes 0-59\n got %s\nwant %s", got, want)
	}
	// no_slices is prefill's own reason: a decode never sends it as an answer's status.
	h = Header{Type: FrameShmAnswer, Seq: 1, Status: uint32(ShmNoSlices)}
	h.Encode(b[:])
	if _, err := DecodeHeader(b[:]); !errors.Is(err, ErrBadFrameType) {
		t.Fatalf("answer with status no_slices: %v, want ErrBadFrameType", err)
	}
}
