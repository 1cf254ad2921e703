package transfer

import (
	"bytes"
	"hash/crc32"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// shmRefusalRig is a receiver (log kept) expecting either the sliced room of the fuzz
// shape (fuzzSlicedKey: pages 4-6 and 7 of 512 bytes) or a whole-page room (shmWholeKey: page
// 4 and 5 of both buffers of 256 bytes, the offered source's page size).
type shmRefusalRig struct {
	rcv  *Receiver
	logs *observer.ObservedLogs
	addr string
}

var shmWholeKey = Key{Room: 43, Nonce: 1, Rank: fuzzSlicedKey.Rank}

func newShmRefusalRig(t *testing.T, sliced bool) *shmRefusalRig {
	t.Helper()
	core, logs := observer.New(zapcore.InfoLevel)
	l := UniformLayout(2, 8, 256, 1, 16)
	if sliced {
		l = UniformLayout(2, 8, 512, 1, 16)
	}
	rcv, _, _, addr := rawReceiver(t, l, ReceiverConfig{Transport: KindAuto, Logger: zap.New(core)})
	e := Expectation{Key: shmWholeKey, Dst: SamePages(2, []Run{{4, 2}}), AuxRow: -1}
	if sliced {
		e = Expectation{Key: fuzzSlicedKey, Dst: [][]Run{{{4, 3}}, {{7, 1}}}, AuxRow: -1, Copies: fuzzSlices}
	}
	if err := rcv.Expect(e); err != nil {
		t.Fatal(err)
	}
	return &shmRefusalRig{rcv: rcv, logs: logs, addr: addr}
}

// shmWholeChunk is a whole-page shm chunk of k naming runs, crc the payload's.
func shmWholeChunk(k Key, seq uint32, runs []ShmRun, crc uint32) []byte {
	meta := AppendShmRuns(make([]byte, HeaderSize), runs)
	var pages uint32
	for _, r := range runs {
		pages += uint32(r.Count)
	}
	(&Header{Type: FrameChunk, Flags: FlagPayloadCRC | FlagShm, Room: k.Room, Nonce: k.Nonce, Rank: k.Rank,
		Seq: seq, NumRuns: uint32(len(runs)), Pages: pages, PayloadCRC: crc, RunsCRC: RunsChecksum(meta[HeaderSize:])}).Encode(meta)
	return meta
}

// wholeRuns are page 5 of both buffers, read from source page 3 of offer 1.
func wholeRuns() []ShmRun {
	return []ShmRun{{ChunkRun: ChunkRun{0, Run{5, 1}}, SrcStart: 3, Offer: 1}, {ChunkRun: ChunkRun{1, Run{5, 1}}, SrcStart: 3, Offer: 1}}
}

func wholeCRC(src *Region) uint32 {
	return crc32.Checksum(append(bytes.Clone(src.Pages(0, Run{3, 1})), src.Pages(1, Run{3, 1})...), castagnoli)
}

// The same-host receiver's refusals are the TCP receiver's: a shm chunk (whole pages or
// head slices) naming an offer never made, source pages past the offered buffer, entries
// that do not decode, a copy that fails prefill's crc32c, and an offer that does not
// parse are each counted in Refused by their reason (invalid, bad_frame, checksum) and
// logged "data frame refused" with the remote end (and the room, for a chunk).
func TestShmReceiverRefusalsAreCountedAndLogged(t *testing.T) {
	type send func(c *rawClient, src *Region)
	for _, c := range []struct {
		name   string
		sliced bool
		send   send
		reason Refusal
		broken bool // the connection breaks (bad_frame)
	}{
		{"whole pages from an offer never made", false, func(c *rawClient, src *Region) {
			r := wholeRuns()
			r[1].Offer = 9
			c.write(shmWholeChunk(shmWholeKey, 0, r, wholeCRC(src)))
		}, RefusedInvalid, false},
		{"whole pages past the offered buffer", false, func(c *rawClient, src *Region) {
			r := wholeRuns()
			r[0].SrcStart = 8
			c.write(shmWholeChunk(shmWholeKey, 0, r, wholeCRC(src)))
		}, RefusedInvalid, false},
		{"whole pages copied with another crc", false, func(c *rawClient, src *Region) {
			c.write(shmWholeChunk(shmWholeKey, 0, wholeRuns(), wholeCRC(src)^1))
		}, RefusedChecksum, false},
		{"whole-page run list that does not decode", false, func(c *rawClient, src *Region) {
			r := wholeRuns()
			r[0].Count = 0
			c.write(shmWholeChunk(shmWholeKey, 0, r, wholeCRC(src)))
		}, RefusedBadFrame, true},
		{"slices from an offer never made", true, func(c *rawClient, src *Region) {
			r := seedShmSliceRuns()
			r[0].Offer = 9
			c.write(shmSlicedChunk(fuzzSlicedKey, 0, r, crc32.Checksum(gathered(src, seedShmSliceRuns()), castagnoli)))
		}, RefusedInvalid, false},
		{"slices past the offered buffer", true, func(c *rawClient, src *Region) {
			r := seedShmSliceRuns()
			r[1].SrcStart = 8
			c.write(shmSlicedChunk(fuzzSlicedKey, 0, r, crc32.Checksum(gathered(src, seedShmSliceRuns()), castagnoli)))
		}, RefusedInvalid, false},
		{"slices copied with another crc", true, func(c *rawClient, src *Region) {
			c.write(shmSlicedChunk(fuzzSlicedKey, 0, seedShmSliceRuns(), crc32.Checksum(gathered(src, seedShmSliceRuns()), castagnoli)^1))
		}, RefusedChecksum, false},
		{"slice entry outside its row", true, func(c *rawClient, src *Region) {
			r := seedShmSliceRuns()
			r[0].DstHead = 4
			c.write(shmSlicedChunk(fuzzSlicedKey, 0, r, 0))
		}, RefusedBadFrame, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := newShmRefusalRig(t, c.sliced)
			conn, src := shmSlicedClient(t, g.addr)
			c.send(conn, src)
			if c.broken {
				wantClosed(t, conn)
			} else if _, copied := conn.results(); copied != 1 {
				t.Fatalf("%d COPIED, want 1", copied)
			}
			for _, r := range AllRefusals() {
				want := uint64(0)
				if r == c.reason {
					want = 1
				}
				if n := g.rcv.Refused(r); n != want {
					t.Fatalf("%s refusals %d, want %d", r, n, want)
				}
			}
			wantShmRefusalLine(t, g.logs, c.reason, true)
		})
	}
	t.Run("offer that does not parse", func(t *testing.T) {
		g := newShmRefusalRig(t, false)
		conn := dialRaw(t, g.addr)
		payload := make([]byte, shmOfferFixed) // a path of no bytes
		offer := make([]byte, HeaderSize)
		(&Header{Type: FrameShmOffer, Flags: FlagPayloadCRC, Rank: shmWholeKey.Rank, Seq: 1, PayloadLen: uint64(len(payload)),
			PayloadCRC: crc32.Checksum(payload, castagnoli)}).Encode(offer)
		conn.write(append(offer, payload...))
		wantClosed(t, conn)
		if n := g.rcv.Refused(RefusedBadFrame); n != 1 {
			t.Fatalf("bad_frame refusals %d, want 1", n)
		}
		wantShmRefusalLine(t, g.logs, RefusedBadFrame, false)
	})
}

// wantShmRefusalLine checks the one "data frame refused" line: its reason, the remote end,
// and the room when room.
func wantShmRefusalLine(t *testing.T, logs *observer.ObservedLogs, reason Refusal, room bool) {
	t.Helper()
	lines := logs.FilterMessage("data frame refused").All()
	if len(lines) != 1 {
		t.Fatalf("%d \"data frame refused\" lines, want 1: %v", len(lines), lines)
	}
	f := lines[0].ContextMap()
	if f["reason"] != reason.String() || f["remote"] == "" || (f["room"] != nil) != room {
		t.Fatalf("refusal logged with %v, want reason %v, the remote end, room %v", f, reason, room)
	}
	if room {
		wantKeyFields(t, f)
	}
}

// wantClosed reads until the receiver closes the connection.
func wantClosed(t *testing.T, c *rawClient) {
	t.Helper()
	c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, c.c); err != nil {
		t.Fatalf("connection not closed by the receiver: %v", err)
	}
}

// A TCP chunk whose payload fails its crc32c is refused as checksum too: the counter
// means the same on both transports.
func TestChunkChecksumMismatchIsRefusedChecksum(t *testing.T) {
	g := newShmRefusalRig(t, false)
	conn := dialRaw(t, g.addr)
	page := bytes.Repeat([]byte{7}, 256)
	conn.write(append(chunkHeader(shmWholeKey, 0, 0, []Run{{5, 1}}, 256, page), bytes.Repeat([]byte{8}, 256)...))
	if res := conn.sync(); res[shmWholeKey] != uint32(ReasonChecksum.code()) {
		t.Fatalf("result %d, want checksum", res[shmWholeKey])
	}
	if n := g.rcv.Refused(RefusedChecksum); n != 1 {
		t.Fatalf("checksum refusals %d, want 1", n)
	}
	wantShmRefusalLine(t, g.logs, RefusedChecksum, true)
}

// offerOn offers src as rank's region under offer id seq on c and wants it accepted.
func offerOn(t testing.TB, c *rawClient, src *Region, rank Rank, seq uint32) {
	t.Helper()
	payload := AppendShmOffer(nil, NewShmOffer(src.Current()))
	offer := make([]byte, HeaderSize)
	(&Header{Type: FrameShmOffer, Flags: FlagPayloadCRC, Rank: rank, Seq: seq, PayloadLen: uint64(len(payload)),
		PayloadCRC: crc32.Checksum(payload, castagnoli)}).Encode(offer)
	c.write(append(offer, payload...))
	var b [HeaderSize]byte
	c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c.c, b[:]); err != nil {
		t.Fatal(err)
	}
	if h, err := DecodeHeader(b[:]); err != nil || h.Type != FrameShmAnswer || h.Status != uint32(ShmAccepted) {
		t.Fatalf("answer to offer %d: %+v, %v; want accepted", seq, h, err)
	}
}

// Whole pages and head slices follow one rule: a chunk stats each prefill file it copies
// from once, whatever the order of its entries (three entries over offers 1, 2, 1: two
// stats, not one per entry nor one per change of offer).
func TestShmChunkStatsEachSourceOnce(t *testing.T) {
	for _, sliced := range []bool{false, true} {
		t.Run(map[bool]string{false: "whole", true: "sliced"}[sliced], func(t *testing.T) {
			g := newShmRefusalRig(t, sliced)
			var stats atomic.Int64
			g.rcv.beforeCheck = func() { stats.Add(1) }
			conn, src := shmSlicedClient(t, g.addr)
			offerOn(t, conn, src, Rank{TP: 0, Size: 2}, 2)
			if sliced {
				at := func(page int32, offer uint32) ShmSliceRun {
					e := ShmSliceRun{SliceRun: fuzzSliceRuns[0], SrcStart: 2, Offer: offer}
					e.Start = page
					return e
				}
				conn.write(shmSlicedChunk(fuzzSlicedKey, 0, []ShmSliceRun{at(4, 1), at(5, 2), at(6, 1)}, 0))
			} else {
				r := []ShmRun{
					{ChunkRun: ChunkRun{0, Run{5, 1}}, SrcStart: 3, Offer: 1},
					{ChunkRun: ChunkRun{1, Run{4, 1}}, SrcStart: 3, Offer: 2},
					{ChunkRun: ChunkRun{1, Run{5, 1}}, SrcStart: 3, Offer: 1},
				}
				conn.write(shmWholeChunk(shmWholeKey, 0, r, 0))
			}
			conn.results()
			if n := stats.Load(); n != 2 {
				t.Fatalf("%d stats, want 2 (one per source)", n)
			}
		})
	}
}
