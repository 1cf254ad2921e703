package transfer

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/pdlink/pdlink/pkg/rankmap"
)

// shmCopied is the bytes every decode rank of g copied from prefill mappings.
func (g *tpRig) shmCopied() uint64 {
	var n uint64
	for _, r := range g.rcv {
		n += r.ShmStats().CopiedBytes
	}
	return n
}

// landedBytes is what a room of pages per buffer lands on every decode rank of sh.
func (sh tpShape) landedBytes(pages int) uint64 {
	rankHeads := max(sh.heads/sh.decodeTP, 1)
	return uint64(sh.decodeTP * sh.buffers * pages * sh.pageTokens * rankHeads * sh.headBytes)
}

// TestPropertySlicedTransferOverShmLandsEachHeadSlice is
// TestPropertySlicedTransferLandsEachHeadSlice with both sides on --data-transport=shm: the
// same random TP topologies, chunk sizes and left-out streams, the same oracle for every
// destination byte, and every page byte copied from the prefill mappings (shm refuses to
// fall back to TCP, and the copied bytes are exactly the bytes that landed).
func TestPropertySlicedTransferOverShmLandsEachHeadSlice(t *testing.T) {
	checkSlicedProperty(t, KindShm, func(rt *rapid.T, g *tpRig, sh tpShape, rm tpRoom, seed uint64) {
		before := g.shmCopied()
		g.move(rt, rm)
		g.check(rt, rm, seed)
		want := sh.landedBytes(len(rm.dst[0]))
		if rm.dropS >= 0 { // the left-out stream's slices never landed
			for _, c := range g.m.DecodeRanks[rm.dropD].Copies {
				if c.From == rm.dropS {
					want -= uint64(len(rm.dst[0]) * c.PageTokens * c.Heads * c.HeadBytes)
				}
			}
		}
		if got := g.shmCopied() - before; got != want {
			rt.Fatalf("%v: %d bytes copied by shm, %d landed", sh, got, want)
		}
	})
}

// TestSlicedTransferOverShm is TestSlicedTransferOverTCP's mappings (2 -> 4 gathers on
// decode, 4 -> 2 scatters, 1 -> 8, 8 -> 1, replicated heads, rows past a piece) with
// both sides on shm over loopback TCP: every byte checked against the oracle, every one
// copied from a prefill mapping, each prefill rank's offer accepted once per decode rank.
func TestSlicedTransferOverShm(t *testing.T) {
	for i, sh := range []tpShape{
		{prefillTP: 2, decodeTP: 4, heads: 8, headBytes: 16, pageTokens: 4, buffers: 2},
		{prefillTP: 4, decodeTP: 2, heads: 8, headBytes: 16, pageTokens: 4, buffers: 2},
		{prefillTP: 1, decodeTP: 8, heads: 8, headBytes: 16, pageTokens: 4, buffers: 2},
		{prefillTP: 8, decodeTP: 1, heads: 8, headBytes: 16, pageTokens: 4, buffers: 2},
		{prefillTP: 8, decodeTP: 2, heads: 4, headBytes: 16, pageTokens: 4, buffers: 2},
		{prefillTP: 2, decodeTP: 1, heads: 16, headBytes: 1024, pageTokens: 2, buffers: 2},
	} {
		t.Run(sh.String(), func(t *testing.T) {
			g := newTPRig(t, sh, true, SenderConfig{Transport: KindShm})
			defer g.close()
			g.fillSources(uint64(i) + 1)
			g.clearDestinations()
			rm := fixedTPRoom()
			g.move(t, rm)
			g.check(t, rm, uint64(i)+1)
			if got, want := g.shmCopied(), sh.landedBytes(4); got != want {
				t.Fatalf("%d bytes copied by shm, %d landed", got, want)
			}
			var accepted uint64
			for _, s := range g.snd {
				accepted += s.ShmStats().Accepted
			}
			var streams uint64
			for _, dr := range g.m.DecodeRanks {
				streams += uint64(len(dr.From))
			}
			if accepted != streams {
				t.Fatalf("%d offers accepted, want one per stream's connection (%d)", accepted, streams)
			}
		})
	}
}

// slicedPair is one stream of head slices on the same host: prefill rank 0 of TP p to
// decode rank 0 of TP d, 8 heads of 256 bytes in 64-token pages (SGLang's shape), 64
// pages per buffer, both sides on auto over loopback TCP, source pages filled.
type slicedPair struct {
	*rig
	copies []rankmap.Copy
	key    Key
}

func slicedLayout(tp int) Layout {
	const heads, headBytes, tokens = 8, 256, 64
	l := UniformLayout(2, 64, int64(tokens*heads/tp*headBytes), 4, 64)
	l.Rank = Rank{Size: uint16(tp)}
	return l.WithHeads(rankmap.MHA, tokens, heads, headBytes)
}

func newSlicedPair(t *testing.T, p, d int, sc SenderConfig, rc ReceiverConfig) *slicedPair {
	t.Helper()
	srcL, dstL := slicedLayout(p), slicedLayout(d)
	m, err := PlanRanks(srcL, dstL)
	if err != nil {
		t.Fatal(err)
	}
	sc.Transport, rc.Transport = KindAuto, KindAuto
	if sc.RedialMin == 0 {
		sc.RedialMin = time.Millisecond
	}
	g := newRig(t, srcL, dstL, true, sc, rc)
	for b := range srcL.Buffers {
		fill(g.src.Buffer(b), uint64(b+1))
	}
	return &slicedPair{rig: g, copies: m.CopiesFrom(0, 0),
		key: Key{Room: 1, Nonce: 1, Rank: Rank{Size: uint16(d)}, From: Rank{Size: uint16(p)}}}
}

// sendRoom expects and sends room's stream of every page of both buffers.
func (sp *slicedPair) sendRoom(t *testing.T, room uint64) (Key, chan error) {
	t.Helper()
	k := sp.key
	k.Room = room
	all := SamePages(2, []Run{{0, 64}})
	if err := sp.rcv.Expect(Expectation{Key: k, Dst: all, AuxRow: -1, Copies: sp.copies}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	err := sp.snd.Send(t.Context(), SendRequest{Peer: sp.addr, Key: k, Src: all, Dst: all, Copies: sp.copies,
		Done: func(err error) { done <- err }})
	if err != nil {
		t.Fatal(err)
	}
	return k, done
}

// wantSlices checks that in every token row of both buffers the copy's heads hold the
// source row's heads it maps there, and every other byte of the row (another prefill
// rank's heads) still holds outside.
func (sp *slicedPair) wantSlices(t *testing.T, outside byte) {
	t.Helper()
	for _, c := range sp.copies { // one per buffer: the stream's
		src, dst := sp.src.Buffer(c.Buffer), sp.dst.Buffer(c.Buffer)
		at, n := c.DstHead*c.HeadBytes, c.Heads*c.HeadBytes
		for row := range len(dst) / c.DstRow {
			d := dst[row*c.DstRow : (row+1)*c.DstRow]
			if s := src[row*c.SrcRow+c.SrcHead*c.HeadBytes:][:n]; !bytes.Equal(d[at:at+n], s) {
				t.Fatalf("buffer %d token row %d: heads at %d are not the source's heads from %d", c.Buffer, row, c.DstHead, c.SrcHead)
			}
			rest := append(bytes.Clone(d[:at]), d[at+n:]...)
			if !bytes.Equal(rest, bytes.Repeat([]byte{outside}, len(rest))) {
				t.Fatalf("buffer %d token row %d: bytes outside the slice written", c.Buffer, row)
			}
		}
	}
}

// TestShmSlicedStreamCopiesEverySliceFromTheMapping: on auto, a stream of head slices
// (prefill TP 2 -> decode TP 4, decode gathers each page's rows from prefill's pages;
// and 4 -> 2, decode scatters a whole prefill page into its rows) goes by shared memory:
// the offer is accepted, every slice byte is copied from the mapping (none as payload),
// crc32c compared as on TCP, and the bytes are the source heads at their destination
// heads with the rest of each row untouched.
func TestShmSlicedStreamCopiesEverySliceFromTheMapping(t *testing.T) {
	for _, c := range []struct{ p, d int }{{2, 4}, {4, 2}} {
		for _, workers := range []int{1, 2} {
			t.Run(fmt.Sprintf("%d_to_%d/workers%d", c.p, c.d, workers), func(t *testing.T) {
				sp := newSlicedPair(t, c.p, c.d, SenderConfig{ConnsPerPeer: 1}, ReceiverConfig{CopyWorkers: workers})
				for b := range 2 {
					memset(sp.dst.Buffer(b), 0xAA)
				}
				k, done := sp.sendRoom(t, 1)
				if err := waitDone(t, done); err != nil {
					t.Fatal(err)
				}
				if r := sp.ev.wait(t, k); r != "" {
					t.Fatalf("receiver outcome %q", r)
				}
				sp.wantSlices(t, 0xAA)
				var want uint64
				for _, cp := range sp.copies {
					want += 64 * uint64(cp.PageTokens*cp.Heads*cp.HeadBytes)
				}
				if rs := sp.rcv.ShmStats(); rs.Accepted != 1 || rs.CopiedBytes != want {
					t.Fatalf("%d offers accepted, %d bytes copied by shm; want 1 and %d", rs.Accepted, rs.CopiedBytes, want)
				}
				sp.rcv.Fence(k)
			})
		}
	}
}

// TestShmSlicedFenceMidCopyLandsNoLaterByte_R7 is TestShmFenceMidCopyLandsNoLaterByte_R7
// for a stream of head slices (2 -> 4: decode gathers the rows): decode fences the room
// while its first piece is being copied; the fence waits for that piece (I9), OnFenced
// follows, and no byte past the pieces in progress ever lands though prefill announced
// the rest; every later chunk is answered, so prefill's budget comes back.
func TestShmSlicedFenceMidCopyLandsNoLaterByte_R7(t *testing.T) {
	for _, workers := range []int{1, 2} {
		t.Run(fmt.Sprintf("workers%d", workers), func(t *testing.T) {
			const piece, chunk = 64 << 10, 1 << 20
			fenced := make(chan Key, 1)
			sp := newSlicedPair(t, 2, 4, SenderConfig{ConnsPerPeer: 1, MaxChunkBytes: chunk},
				ReceiverConfig{PieceBytes: piece, CopyWorkers: workers, OnFenced: func(k Key) { fenced <- k }})
			held, letGo := holdFirstCopy(t, sp.rcv)
			k, done := sp.sendRoom(t, 1)
			waitClosed(t, held, "first piece of slices copied from the prefill mapping")
			if sp.rcv.Fence(k) {
				t.Fatal("fence done while a piece was being copied")
			}
			letGo()
			waitFenced(t, fenced, k)
			snapshot := bytes.Clone(sp.dst.Buffer(0))
			if err := waitDone(t, done); err == nil {
				t.Fatal("fenced room reported success to the sender")
			}
			if !bytes.Equal(sp.dst.Buffer(0), snapshot) {
				t.Fatal("destination changed after the fence was done")
			}
			// 2 -> 4 fills whole destination pages, so the chunk's order is buffer 0's.
			for off, b := range sp.dst.Buffer(0) {
				inProgress := false
				for w := range workers {
					start := chunk * w / workers
					inProgress = inProgress || off >= start && off < start+piece
				}
				if b != 0 && !inProgress {
					t.Fatalf("byte %d landed: past the pieces in progress at the fence", off)
				}
			}
			if !untouched0(sp.dst.Buffer(1)) {
				t.Fatal("buffer 1 (after the fence) was written")
			}
			waitBudget(t, sp.rig, 0)
		})
	}
}

func untouched0(b []byte) bool { return bytes.Equal(b, make([]byte, len(b))) }

// TestShmSlicedSourceTruncatedMidCopyFailsRoomDecodeServes: the prefill file is truncated
// to 0 while decode scatters a stream's first piece of slices from it (4 -> 2). The copy
// faults inside touchRegion: the room fails transfer_error on both sides, the fault is
// counted, the process lives, and the same connection serves the next room of slices
// once the file is whole again.
func TestShmSlicedSourceTruncatedMidCopyFailsRoomDecodeServes(t *testing.T) {
	d := &corruptingDialer{at: -1}
	sp := newSlicedPair(t, 4, 2, SenderConfig{ConnsPerPeer: 1, Dialer: d, Checksum: ChecksumNone},
		ReceiverConfig{Checksum: ChecksumNone})
	hook, held, release := holdFirst()
	sp.rcv.beforeTouch = hook
	letGo := releaseOnCleanup(t, release)
	k1, done := sp.sendRoom(t, 1)
	waitClosed(t, held, "first piece of slices copied from the prefill mapping")
	if err := os.Truncate(sp.src.Path(), 0); err != nil {
		t.Fatal(err)
	}
	letGo()
	if r := sp.ev.wait(t, k1); r != ReasonTransferError {
		t.Fatalf("room on a truncated prefill file: receiver outcome %q, want transfer_error", r)
	}
	if err := waitDone(t, done); ReasonOf(err) != ReasonTransferError {
		t.Fatalf("room on a truncated prefill file: sender got %v, want transfer_error", err)
	}
	if n := sp.dst.Faults(); n != 1 {
		t.Fatalf("faults %d, want 1", n)
	}
	sp.rcv.Fence(k1)
	if err := os.Truncate(sp.src.Path(), sp.src.Layout().Size()); err != nil {
		t.Fatal(err)
	}
	for b := range 2 {
		fill(sp.src.Buffer(b), uint64(b+20))
	}
	k2, done := sp.sendRoom(t, 2)
	if err := waitDone(t, done); err != nil {
		t.Fatalf("room after the file is whole again: %v", err)
	}
	sp.wantSlices(t, 0)
	if n := d.dials.Load(); n != 1 {
		t.Fatalf("%d dials: the connection was dropped", n)
	}
	sp.rcv.Fence(k2)
}

// shmSlicedClient is a raw data connection to slicedReceiver on which a prefill region of
// the fuzz shape (two buffers of eight 256-byte pages: 4 tokens of 64-byte rows, the rows
// fuzzSlices read) was offered and accepted as offer 1.
func shmSlicedClient(t testing.TB, addr string) (*rawClient, *Region) {
	t.Helper()
	src := openTestRegion(t, UniformLayout(2, 8, 256, 1, 16))
	for b := range 2 {
		fill(src.Buffer(b), uint64(b+9))
	}
	c := dialRaw(t, addr)
	offerOn(t, c, src, fuzzSlicedKey.Rank, 1)
	return c, src
}

// shmSlicedChunk is a sliced shm chunk of k naming runs, crc the payload's.
func shmSlicedChunk(k Key, seq uint32, runs []ShmSliceRun, crc uint32) []byte {
	meta := AppendShmSliceRuns(make([]byte, HeaderSize), runs)
	var pages uint32
	for _, r := range runs {
		pages += uint32(r.Count)
	}
	(&Header{Type: FrameChunk, Flags: FlagPayloadCRC | FlagShm | FlagSliced, Room: k.Room, Nonce: k.Nonce, Rank: k.Rank,
		From: k.From, Seq: seq, NumRuns: uint32(len(runs)), Pages: pages, PayloadCRC: crc,
		RunsCRC: RunsChecksum(meta[HeaderSize:])}).Encode(meta)
	return meta
}

// results sends a ping and reads until the pong: the RESULT codes by key, and how many
// COPIED frames came on the way.
func (r *rawClient) results() (map[Key]uint32, int) {
	r.t.Helper()
	var b [HeaderSize]byte
	(&Header{Type: FramePing}).Encode(b[:])
	r.write(b[:])
	res, copied := map[Key]uint32{}, 0
	for {
		r.c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(r.c, b[:]); err != nil {
			r.t.Fatalf("results: %v", err)
		}
		h, err := DecodeHeader(b[:])
		if err != nil {
			r.t.Fatalf("results: %v", err)
		}
		switch h.Type {
		case FramePong:
			return res, copied
		case FrameCopied:
			copied++
		case FrameResult:
			res[h.Key()] = h.Status
		}
	}
}

// seedShmSliceRuns are fuzzSliceRuns read from source pages 2 and 5 of offer 1.
func seedShmSliceRuns() []ShmSliceRun {
	return []ShmSliceRun{{SliceRun: fuzzSliceRuns[0], SrcStart: 2, Offer: 1}, {SliceRun: fuzzSliceRuns[1], SrcStart: 5, Offer: 1}}
}

// gathered is the seed chunk's payload as TCP would carry it: each entry's source rows'
// heads, token by token.
func gathered(src *Region, runs []ShmSliceRun) []byte {
	var out []byte
	for _, r := range runs {
		cp := fuzzSlices[r.Buffer]
		for _, row := range sliceRows(nil, src.Pages(int(r.Buffer), Run{Start: r.SrcStart, Count: r.Count}), int64(r.Count),
			cp.SrcRow, cp.SrcHead*cp.HeadBytes, cp.Heads*cp.HeadBytes, cp.PageTokens) {
			out = append(out, row...)
		}
	}
	return out
}

// TestShmSlicedChunkLandsOnlyItsHeads: a sliced shm chunk whose crc32c is prefill's over
// the gathered source heads (the TCP payload's order) completes its room: each head lands
// at its destination head in every row, copied from the source page the entry names, and
// no other byte of those pages changes.
func TestShmSlicedChunkLandsOnlyItsHeads(t *testing.T) {
	_, dst, ev, addr, _ := slicedReceiverOn(t, KindAuto)
	c, src := shmSlicedClient(t, addr)
	sk, runs := fuzzSlicedKey, seedShmSliceRuns()
	payload := gathered(src, runs)
	c.write(shmSlicedChunk(sk, 0, runs, crc32.Checksum(payload, castagnoli)))
	c.write(doneFrame(sk, 1, 2, nil))
	if res, copied := c.results(); res[sk] != uint32(codeOK) || copied != 1 {
		t.Fatalf("result %d, %d COPIED; want ok and 1", res[sk], copied)
	}
	if r, ok := ev.get(sk); !ok || r != "" {
		t.Fatalf("outcome %q (reported %v), want complete", r, ok)
	}
	headsLanded(t, dst, payload)
}

// TestShmSlicedChunkRefusesBadEntriesBeforeAByteLands: a sliced shm chunk naming source
// pages past the offered buffer, an offer never made, a slice its room does not expect, one
// (page, slice) twice, slices for a room of whole pages, or carrying the crc of other
// bytes fails its room (invalid, or checksum for the crc) with RESULT and COPIED; the
// refusals before the copy write no byte, and the connection goes on serving.
func TestShmSlicedChunkRefusesBadEntriesBeforeAByteLands(t *testing.T) {
	shifted := seedShmSliceRuns()[:1]
	shifted[0].DstHead = 1
	for _, c := range []struct {
		name   string
		runs   func([]ShmSliceRun) []ShmSliceRun
		whole  bool // for the room of whole pages
		crc    bool // the wrong crc: the copy lands, the room fails checksum
		reason Reason
	}{
		{"source past the offered buffer", func(r []ShmSliceRun) []ShmSliceRun { r[1].SrcStart = 8; return r }, false, false, ReasonInvalid},
		{"offer never made", func(r []ShmSliceRun) []ShmSliceRun { r[0].Offer = 9; return r }, false, false, ReasonInvalid},
		{"foreign slice", func([]ShmSliceRun) []ShmSliceRun { return shifted }, false, false, ReasonInvalid},
		{"repeated slice", func(r []ShmSliceRun) []ShmSliceRun { return []ShmSliceRun{r[0], r[0]} }, false, false, ReasonInvalid},
		{"slices for a room of whole pages", func(r []ShmSliceRun) []ShmSliceRun { r[0].Start = 5; return r[:1] }, true, false, ReasonInvalid},
		{"crc of other bytes", func(r []ShmSliceRun) []ShmSliceRun { return r }, false, true, ReasonChecksum},
	} {
		t.Run(c.name, func(t *testing.T) {
			rcv, dst, ev, addr, whole := slicedReceiverOn(t, KindAuto)
			conn, src := shmSlicedClient(t, addr)
			k := fuzzSlicedKey
			if c.whole {
				k = whole
			}
			runs := c.runs(seedShmSliceRuns())
			crc := crc32.Checksum(gathered(src, seedShmSliceRuns()), castagnoli)
			if c.crc {
				crc ^= 1
			}
			conn.write(shmSlicedChunk(k, 0, runs, crc))
			res, copied := conn.results()
			if r, ok := ev.get(k); !ok || r != c.reason || res[k] != uint32(c.reason.code()) || copied != 1 {
				t.Fatalf("outcome %q (reported %v), result %d, %d COPIED; want %s and 1", r, ok, res[k], copied, c.reason)
			}
			if !c.crc && (!untouched(dst.Buffer(0)) || !untouched(dst.Buffer(1))) {
				t.Fatal("a refused chunk wrote")
			}
			if n := rcv.Stats().RejectedFrames; !c.crc && n != 1 {
				t.Fatalf("%d rejected frames, want 1", n)
			}
			// The connection still serves: the whole-page room's page over TCP on it.
			if !c.whole {
				page := bytes.Repeat([]byte{3}, 512)
				conn.write(append(chunkHeader(whole, 0, 0, []Run{{5, 1}}, 512, page), page...))
				conn.write(append(chunkHeader(whole, 1, 1, []Run{{5, 1}}, 512, page), page...))
				conn.write(doneFrame(whole, 2, 2, nil))
				if res, _ := conn.results(); res[whole] != uint32(codeOK) {
					t.Fatalf("whole-page room after the refusal: result %d, want ok", res[whole])
				}
			}
		})
	}
}

// FuzzShmSlicedChunk feeds a live receiver, on a connection whose prefill region was
// proven, sliced shm chunks with arbitrary entries (their run-list checksum right, so they
// reach the claim): it never panics and no byte lands outside the heads the room of
// slices expects on its pages.
func FuzzShmSlicedChunk(f *testing.F) {
	seed := AppendShmSliceRuns(nil, seedShmSliceRuns())
	f.Add(seed, uint32(2), uint32(0))
	runs := seedShmSliceRuns()
	runs[1].SrcStart = 7
	f.Add(AppendShmSliceRuns(nil, runs), uint32(2), uint32(0))
	f.Add(AppendShmSliceRuns(nil, runs[:1]), uint32(1<<31), uint32(0))
	rcv, dst, _, addr := rawReceiver(f, UniformLayout(2, 8, 512, 1, 16), ReceiverConfig{Transport: KindAuto, IdleTimeout: time.Second})
	var room uint64
	f.Fuzz(func(t *testing.T, entries []byte, pages, crc uint32) {
		room++
		k := fuzzSlicedKey
		k.Room = room
		memset(dst.Buffer(0), 0xAA)
		memset(dst.Buffer(1), 0xAA)
		if err := rcv.Expect(Expectation{Key: k, Dst: [][]Run{{{6, 1}}, {{7, 1}}}, AuxRow: -1, Copies: fuzzSlices}); err != nil {
			t.Fatal(err)
		}
		defer rcv.Fence(k)
		c, _ := shmSlicedClient(t, addr)
		n := len(entries) / shmSliceRunSize
		meta := append(make([]byte, HeaderSize), entries[:n*shmSliceRunSize]...)
		(&Header{Type: FrameChunk, Flags: FlagPayloadCRC | FlagShm | FlagSliced, Room: k.Room, Nonce: k.Nonce, Rank: k.Rank,
			NumRuns: uint32(max(n, 1)), Pages: max(pages%64, 1), PayloadCRC: crc, RunsCRC: RunsChecksum(meta[HeaderSize:])}).Encode(meta)
		c.c.SetWriteDeadline(time.Now().Add(2 * time.Second))
		c.c.Write(meta)
		c.c.Close()
		waitFor(t, func() bool { rcv.mu.Lock(); defer rcv.mu.Unlock(); return len(rcv.conns) == 0 })
		var outside []byte
		for b := range 2 {
			for p := range int32(8) {
				page := dst.Pages(b, Run{p, 1})
				if p != int32(6+b) {
					outside = append(outside, page...)
					continue
				}
				cp := fuzzSlices[b]
				for tok := range 4 {
					row := page[tok*128 : (tok+1)*128]
					outside = append(outside, row[:cp.DstHead*cp.HeadBytes]...)
					outside = append(outside, row[(cp.DstHead+cp.Heads)*cp.HeadBytes:]...)
				}
			}
		}
		if !untouched(outside) {
			t.Fatal("bytes landed outside the room's expected heads")
		}
	})
}
