package transfer

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// TestChunkCarriesPagesOfSeveralBuffers: a one-page room of 64 buffers goes on the wire as
// one CHUNK naming all 64 buffers and one DONE (wire v1 took 64 chunks), every page lands in
// its own buffer; and with a chunk bound of ten pages the same room is seven chunks, none
// over the bound, whose totals the DONE carries.
func TestChunkCarriesPagesOfSeveralBuffers(t *testing.T) {
	const item, nbuf = 256, 64
	l := UniformLayout(nbuf, 4, item, 2, 16)
	for _, tc := range []struct {
		name     string
		maxChunk int64
		chunks   int
	}{{"default bound", 0, 1}, {"ten pages a chunk", 10 * item, 7}} {
		t.Run(tc.name, func(t *testing.T) {
			tap := &tapDialer{}
			g := newRig(t, l, l, true, SenderConfig{ConnsPerPeer: 1, MaxChunkBytes: tc.maxChunk, Dialer: tap}, ReceiverConfig{})
			for b := range nbuf {
				fill(g.src.Buffer(b), uint64(b+1))
				memset(g.dst.Buffer(b), 0xAA)
			}
			k := Key{Room: 5, Nonce: 2, Rank: Rank{TP: 0, Size: 1}}
			src, dst := SamePages(nbuf, []Run{{1, 1}}), SamePages(nbuf, []Run{{3, 1}})
			if err := g.rcv.Expect(Expectation{Key: k, Dst: dst, AuxRow: 1}); err != nil {
				t.Fatal(err)
			}
			aux := bytes.Repeat([]byte{4}, 16)
			if err := waitDone(t, g.send(t, k, src, dst, aux)); err != nil {
				t.Fatal(err)
			}
			var chunks []Header
			var dones []Header
			for _, h := range tap.frames(t) {
				switch h.Type {
				case FrameChunk:
					chunks = append(chunks, h)
				case FrameDone:
					dones = append(dones, h)
				}
			}
			if len(chunks) != tc.chunks || len(dones) != 1 {
				t.Fatalf("%d CHUNK and %d DONE frames, want %d and 1", len(chunks), len(dones), tc.chunks)
			}
			pages := uint32(0)
			for _, h := range chunks {
				if tc.maxChunk != 0 && int64(h.PayloadLen) > tc.maxChunk {
					t.Fatalf("chunk of %d bytes over the bound %d", h.PayloadLen, tc.maxChunk)
				}
				pages += h.Pages
			}
			if d := dones[0]; pages != nbuf || d.Seq != uint32(tc.chunks) || d.Pages != nbuf {
				t.Fatalf("chunks carry %d pages; DONE seq %d pages %d, want %d chunks and %d pages", pages, d.Seq, d.Pages, tc.chunks, nbuf)
			}
			if tc.chunks == 1 && chunks[0].NumRuns != nbuf {
				t.Fatalf("the one chunk names %d runs, want one per buffer", chunks[0].NumRuns)
			}
			for b := range nbuf {
				if !bytes.Equal(g.dst.Pages(b, Run{3, 1}), g.src.Pages(b, Run{1, 1})) {
					t.Fatalf("buffer %d: the page did not land in its own buffer", b)
				}
				if rest := g.dst.Pages(b, Run{0, 3}); !bytes.Equal(rest, bytes.Repeat([]byte{0xAA}, len(rest))) {
					t.Fatalf("buffer %d: bytes outside the room's page", b)
				}
			}
			if r, ok := g.ev.get(k); !ok || r != "" || !bytes.Equal(g.dst.AuxRow(1), aux) {
				t.Fatalf("outcome %q (reported %v), want complete with the aux row", r, ok)
			}
		})
	}
}

// TestV1FramesAreRefused: a v1 frame (no rank, one buffer) is refused by the decoder with
// ErrBadVersion, and by a receiver before any of its bytes land: the frame is counted as
// rejected and its connection closed, the room it names is untouched and still takes a v3
// stream.
func TestV1FramesAreRefused(t *testing.T) {
	const item = 512
	l := UniformLayout(1, 4, item, 0, 0)
	rcv, dst, ev, addr := rawReceiver(t, l, ReceiverConfig{})
	memset(dst.Buffer(0), 0xAA)
	k := Key{Room: 3, Nonce: 9}
	if err := rcv.Expect(Expectation{Key: k, Dst: [][]Run{{{0, 1}}}, AuxRow: -1}); err != nil {
		t.Fatal(err)
	}
	page := bytes.Repeat([]byte{7}, item)
	v1Runs := []byte{0, 0, 0, 0, 1, 0, 0, 0} // {start 0, count 1}
	v1 := encodeV1(Header{Type: FrameChunk, Room: k.Room, Nonce: k.Nonce, NumRuns: 1, Pages: 1, PayloadLen: item,
		RunsCRC: RunsChecksum(v1Runs)}, 0)
	if _, err := DecodeHeader(v1); !errors.Is(err, ErrBadVersion) {
		t.Fatalf("decode a v1 header: %v, want ErrBadVersion", err)
	}

	c := dialRaw(t, addr)
	c.write(append(append(v1, v1Runs...), page...))
	c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var b [HeaderSize]byte
	n, err := io.ReadFull(c.c, b[:])
	var ne net.Error
	if err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("after a v1 frame the connection answered %d bytes (%v), want it closed", n, err)
	}
	if n := rcv.Stats().RejectedFrames; n != 1 {
		t.Fatalf("%d rejected frames, want the v1 frame counted", n)
	}
	if !bytes.Equal(dst.Pages(0, Run{0, 1}), bytes.Repeat([]byte{0xAA}, item)) {
		t.Fatal("a v1 frame's bytes landed")
	}
	if r, ok := ev.get(k); ok {
		t.Fatalf("the room has outcome %q from a v1 frame", r)
	}

	c = dialRaw(t, addr) // the twin: the same room over the current version completes
	c.write(chunkHeader(k, 0, 0, []Run{{0, 1}}, item, page))
	c.write(page)
	c.write(doneFrame(k, 1, 1, nil))
	if res := c.sync(); res[k] != uint32(codeOK) {
		t.Fatalf("twin: result %d, want ok", res[k])
	}
	if !bytes.Equal(dst.Pages(0, Run{0, 1}), page) {
		t.Fatal("twin: page not in place")
	}
}

// TestRunNamingABufferPastTheLayoutIsRejectedBeforeAnyByte: a chunk whose first run is a
// page of the room and whose second names buffer 2 of a two-buffer layout fails the room as
// invalid before a byte lands, the first run's page included; so does a chunk naming one
// page twice across its runs. Twin rooms whose chunks name the same pages correctly
// complete on the same connection.
func TestRunNamingABufferPastTheLayoutIsRejectedBeforeAnyByte(t *testing.T) {
	const item = 512
	l := UniformLayout(2, 4, item, 0, 0)
	rcv, dst, ev, addr := rawReceiver(t, l, ReceiverConfig{})
	past, twice, twin := Key{Room: 1, Nonce: 1}, Key{Room: 2, Nonce: 1}, Key{Room: 3, Nonce: 1}
	pages := map[Key]int32{past: 0, twice: 1, twin: 2}
	for k, p := range pages {
		if err := rcv.Expect(Expectation{Key: k, Dst: SamePages(2, []Run{{p, 1}}), AuxRow: -1}); err != nil {
			t.Fatal(err)
		}
	}
	memset(dst.Buffer(0), 0xAA)
	memset(dst.Buffer(1), 0xAA)
	payload := bytes.Repeat([]byte{7}, 2*item)
	c := dialRaw(t, addr)
	for k, runs := range map[Key][]ChunkRun{
		past:  {{0, Run{0, 1}}, {2, Run{0, 1}}},
		twice: {{1, Run{1, 1}}, {1, Run{1, 1}}},
		twin:  {{1, Run{2, 1}}, {0, Run{2, 1}}},
	} {
		c.write(chunkHeaderRuns(k, 0, runs, item, payload))
		c.write(payload)
	}
	c.write(doneFrame(twin, 1, 2, nil))
	res := c.sync()
	for _, k := range []Key{past, twice} {
		if r, _ := ev.get(k); r != ReasonInvalid || res[k] != uint32(codeInvalid) {
			t.Fatalf("%v: outcome %q, result %d; want invalid", k, r, res[k])
		}
		for b := range 2 {
			if got := dst.Pages(b, Run{pages[k], 1}); !bytes.Equal(got, bytes.Repeat([]byte{0xAA}, item)) {
				t.Fatalf("%v: buffer %d page %d was written by a refused chunk", k, b, pages[k])
			}
		}
	}
	if r, ok := ev.get(twin); !ok || r != "" || res[twin] != uint32(codeOK) {
		t.Fatalf("twin: outcome %q (reported %v), result %d; want complete", r, ok, res[twin])
	}
	for b := range 2 {
		if !bytes.Equal(dst.Pages(b, Run{2, 1}), payload[:item]) {
			t.Fatalf("twin: buffer %d page not in place", b)
		}
	}
	if n := rcv.Stats().RejectedFrames; n != 2 {
		t.Fatalf("%d rejected frames, want 2", n)
	}
}

// TestV2FramesAreRefused: a v2 frame (every field as v3's, version 2) is refused by the
// decoder with ErrBadVersion, and by a receiver before any of its bytes land: counted as
// rejected, its connection closed, the room untouched and still taking the same frame as v3.
func TestV2FramesAreRefused(t *testing.T) {
	const item = 512
	l := UniformLayout(1, 4, item, 0, 0)
	rcv, dst, ev, addr := rawReceiver(t, l, ReceiverConfig{})
	memset(dst.Buffer(0), 0xAA)
	k := Key{Room: 3, Nonce: 9, Rank: Rank{Size: 1}}
	if err := rcv.Expect(Expectation{Key: k, Dst: [][]Run{{{0, 1}}}, AuxRow: -1}); err != nil {
		t.Fatal(err)
	}
	page := bytes.Repeat([]byte{7}, item)
	v3 := chunkHeader(k, 0, 0, []Run{{0, 1}}, item, page)
	v2 := withVersion(v3, 2)
	if _, err := DecodeHeader(v2); !errors.Is(err, ErrBadVersion) {
		t.Fatalf("decode a v2 header: %v, want ErrBadVersion", err)
	}
	c := dialRaw(t, addr)
	c.write(append(v2, page...))
	c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var b [HeaderSize]byte
	n, err := io.ReadFull(c.c, b[:])
	var ne net.Error
	if err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("after a v2 frame the connection answered %d bytes (%v), want it closed", n, err)
	}
	if n := rcv.Stats().RejectedFrames; n != 1 {
		t.Fatalf("%d rejected frames, want the v2 frame counted", n)
	}
	if !bytes.Equal(dst.Pages(0, Run{0, 1}), bytes.Repeat([]byte{0xAA}, item)) {
		t.Fatal("a v2 frame's bytes landed")
	}
	if r, ok := ev.get(k); ok {
		t.Fatalf("the room has outcome %q from a v2 frame", r)
	}
	c = dialRaw(t, addr)
	c.write(append(v3, page...))
	c.write(doneFrame(k, 1, 1, nil))
	if res := c.sync(); res[k] != uint32(codeOK) {
		t.Fatalf("v3 twin: result %d, want ok", res[k])
	}
}

// TestWholePageHeadersKeepTheirV2Bytes: wire v3 changed no byte of a whole-page frame but
// the version (and so the header checksum): every frame type's header, encoded from v2's
// field table, equals this build's with the version byte swapped.
func TestWholePageHeadersKeepTheirV2Bytes(t *testing.T) {
	k := Key{Room: 0x0102030405060708, Nonce: 0x1112131415161718, Rank: Rank{TP: 3, Size: 4}}
	for _, h := range []Header{
		{Type: FrameChunk, Flags: FlagPayloadCRC, Room: k.Room, Nonce: k.Nonce, Rank: k.Rank, Seq: 5, NumRuns: 2, Pages: 9,
			PayloadLen: 9 * 4096, PayloadCRC: 0xdeadbeef, RunsCRC: 0xfeedface},
		{Type: FrameDone, Flags: FlagPayloadCRC, Room: k.Room, Nonce: k.Nonce, Rank: k.Rank, Seq: 6, Pages: 9, PayloadLen: 24, PayloadCRC: 7},
		{Type: FrameResult, Room: k.Room, Nonce: k.Nonce, Rank: k.Rank, Status: uint32(codeInvalid)},
		{Type: FramePing}, {Type: FramePong},
	} {
		b := make([]byte, HeaderSize)
		h.Encode(b)
		if b[4] != WireVersion || WireVersion != 3 {
			t.Fatalf("version byte %d, WireVersion %d; want 3", b[4], WireVersion)
		}
		if got, want := withVersion(b, 2), encodeV2(h); !bytes.Equal(got, want) {
			t.Errorf("frame type %d:\n v3 as v2 %x\n v2       %x", h.Type, got, want)
		}
	}
	runs := []ChunkRun{{Buffer: 1, Run: Run{Start: 2, Count: 3}}}
	if got := AppendRuns(nil, runs); !bytes.Equal(got, []byte{1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0}) {
		t.Errorf("whole-page run entry %x, want v2's {buffer, start, count}", got)
	}
}

// TestSlicedFlagIsRefusedOffChunks: FlagSliced means a chunk's run list; on any other frame
// the header is refused (ErrBadFrameType), as an unknown flag is.
func TestSlicedFlagIsRefusedOffChunks(t *testing.T) {
	for _, h := range []Header{
		{Type: FrameDone, Flags: FlagSliced, Room: 1, Nonce: 1, Rank: Rank{Size: 1}},
		{Type: FrameResult, Flags: FlagSliced, Room: 1, Nonce: 1, Rank: Rank{Size: 1}},
		{Type: FramePing, Flags: FlagSliced},
		{Type: FrameChunk, Flags: 4, Room: 1, Nonce: 1, NumRuns: 1, Pages: 1, PayloadLen: 1},
	} {
		b := make([]byte, HeaderSize)
		h.Encode(b)
		if _, err := DecodeHeader(b); !errors.Is(err, ErrBadFrameType) {
			t.Errorf("type %d flags %#x: %v, want ErrBadFrameType", h.Type, h.Flags, err)
		}
	}
	b := make([]byte, HeaderSize)
	(&Header{Type: FrameChunk, Flags: FlagSliced | FlagPayloadCRC, Room: 1, Nonce: 1, NumRuns: 1, Pages: 1, PayloadLen: 1}).Encode(b)
	if _, err := DecodeHeader(b); err != nil {
		t.Errorf("a sliced chunk: %v", err)
	}
}

// TestFromRankTellsTwoPrefillRanksStreamsApart: a sliced stream's frames name their
// prefill rank (Key.From, bytes 30-31), so two prefill ranks feeding one decode rank are two
// keys on the wire; a malformed from rank, or one on a keepalive, is refused.
func TestFromRankTellsTwoPrefillRanksStreamsApart(t *testing.T) {
	k := Key{Room: 5, Nonce: 6, Rank: Rank{TP: 0, Size: 2}}
	for _, from := range []Rank{{TP: 0, Size: 4}, {TP: 1, Size: 4}, {TP: 7, Size: 8}} {
		k.From = from
		for _, h := range []Header{
			{Type: FrameDone, Room: k.Room, Nonce: k.Nonce, Rank: k.Rank, From: k.From, Seq: 1, Pages: 1},
			{Type: FrameResult, Room: k.Room, Nonce: k.Nonce, Rank: k.Rank, From: k.From, Status: uint32(maxReasonCode)},
		} {
			b := make([]byte, HeaderSize)
			h.Encode(b)
			got, err := DecodeHeader(b)
			if err != nil || got.Key() != k || got.Status != h.Status {
				t.Errorf("from %v type %d: decoded %+v, %v; want key %v", from, h.Type, got, err, k)
			}
		}
	}
	for _, h := range []Header{
		{Type: FrameDone, Room: 1, Nonce: 1, Rank: Rank{Size: 1}, From: Rank{TP: 2, Size: 2}},
		{Type: FrameDone, Room: 1, Nonce: 1, Rank: Rank{Size: 1}, From: Rank{TP: 1}},
		{Type: FramePing, From: Rank{TP: 0, Size: 2}},
	} {
		b := make([]byte, HeaderSize)
		h.Encode(b)
		if _, err := DecodeHeader(b); !errors.Is(err, ErrBadFrameType) {
			t.Errorf("from %v on type %d: %v, want ErrBadFrameType", h.From, h.Type, err)
		}
	}
}
