package transfer

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/pdlink/pdlink/pkg/rankmap"
)

// wireSentinels are the errors a decoder may return (wrapped).
var wireSentinels = []error{ErrShortFrame, ErrBadMagic, ErrBadVersion, ErrHeaderChecksum, ErrBadFrameType,
	ErrFrameTooLarge, ErrRunsChecksum, ErrEmptyRun, ErrBadSlice}

func isWireSentinel(err error) bool {
	for _, s := range wireSentinels {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// fuzzKey is the room the fuzz seeds speak of: a rank of a room with two.
var fuzzKey = Key{Room: 42, Nonce: 7, Rank: Rank{TP: 1, Size: 2}}

// fuzzSlicedKey is the room of head slices the seeds speak of; fuzzSlices are the
// slices it expects (4-token pages of 128-byte rows: heads 2-3 of buffer 0's rows, head 0
// of buffer 1's), fuzzSliceRuns a chunk that brings them all.
var (
	fuzzSlicedKey = Key{Room: 42, Nonce: 8, Rank: Rank{TP: 1, Size: 2}}
	fuzzSlices    = []rankmap.Copy{
		{Buffer: 0, SrcHead: 0, DstHead: 2, Heads: 2, HeadBytes: 32, PageTokens: 4, SrcRow: 64, DstRow: 128},
		{Buffer: 1, SrcHead: 1, DstHead: 0, Heads: 1, HeadBytes: 32, PageTokens: 4, SrcRow: 64, DstRow: 128},
	}
	fuzzSliceRuns = []SliceRun{
		{ChunkRun: ChunkRun{0, Run{6, 1}}, SrcHead: 0, DstHead: 2, Heads: 2, HeadBytes: 32, RowBytes: 128},
		{ChunkRun: ChunkRun{1, Run{7, 1}}, SrcHead: 1, DstHead: 0, Heads: 1, HeadBytes: 32, RowBytes: 128},
	}
	// fuzzFromKey is a second prefill rank's stream into the same decode rank and pages
	// (MHA 4 -> 2): its key differs from fuzzSlicedKey only by From, and its slices are
	// the rows' heads the other stream leaves.
	fuzzFromKey    = Key{Room: 42, Nonce: 8, Rank: Rank{TP: 1, Size: 2}, From: Rank{TP: 3, Size: 4}}
	fuzzFromSlices = []rankmap.Copy{
		{Buffer: 0, SrcHead: 0, DstHead: 0, Heads: 2, HeadBytes: 32, PageTokens: 4, SrcRow: 64, DstRow: 128},
		{Buffer: 1, SrcHead: 0, DstHead: 1, Heads: 1, HeadBytes: 32, PageTokens: 4, SrcRow: 64, DstRow: 128},
	}
	fuzzFromRuns = []SliceRun{
		{ChunkRun: ChunkRun{0, Run{6, 1}}, SrcHead: 0, DstHead: 0, Heads: 2, HeadBytes: 32, RowBytes: 128},
		{ChunkRun: ChunkRun{1, Run{7, 1}}, SrcHead: 0, DstHead: 1, Heads: 1, HeadBytes: 32, RowBytes: 128},
	}
)

// seedFrames are frames of every type, the seeds of the fuzz targets: valid v3 frames, a
// chunk naming two buffers, a whole stream of fuzzKey (its pages in FuzzReceiverStream's
// room, then DONE), a whole stream of head slices for fuzzSlicedKey, and a v1 and a v2
// frame (refused).
func seedFrames() [][]byte {
	k := fuzzKey
	var out [][]byte
	for _, h := range []Header{
		{Type: FramePing}, {Type: FramePong},
		{Type: FrameResult, Room: k.Room, Nonce: k.Nonce, Rank: k.Rank, From: k.From, Status: uint32(codeChecksum)},
		{Type: FrameDone, Flags: FlagPayloadCRC, Room: k.Room, Nonce: k.Nonce, Rank: k.Rank, From: k.From, Seq: 1, Pages: 3, PayloadLen: 16},
	} {
		b := make([]byte, HeaderSize)
		h.Encode(b)
		out = append(out, b)
	}
	page := bytes.Repeat([]byte{9}, 512)
	payload := bytes.Repeat(page, 2)
	out = append(out, append(chunkHeader(k, 0, 0, []Run{{1, 2}}, 512, payload), payload...))
	runs := []ChunkRun{{0, Run{1, 2}}, {1, Run{3, 1}}}
	payload = bytes.Repeat(page, 3)
	stream := append(chunkHeaderRuns(k, 0, runs, 512, payload), payload...)
	out = append(out, stream)
	out = append(out, append(bytes.Clone(stream), doneFrame(k, 1, 3, bytes.Repeat([]byte{5}, 16))...))
	out = append(out, encodeV1(Header{Type: FrameChunk, Flags: FlagPayloadCRC, Room: k.Room, Nonce: k.Nonce,
		NumRuns: 1, Pages: 1, PayloadLen: 512}, 0))
	sk := fuzzSlicedKey
	payload = bytes.Repeat([]byte{3}, 4*2*32+4*1*32)
	sliced := append(slicedChunkHeader(sk, 0, fuzzSliceRuns, 4, payload), payload...)
	out = append(out, append(sliced, doneFrame(sk, 1, 2, nil)...))
	fk := fuzzFromKey
	from := append(slicedChunkHeader(fk, 0, fuzzFromRuns, 4, payload), payload...)
	out = append(out, append(from, doneFrame(fk, 1, 2, nil)...))
	out = append(out, slices.Concat(sliced, from, doneFrame(fk, 1, 2, nil), doneFrame(sk, 1, 2, nil)))
	v2 := append(chunkHeader(k, 0, 0, []Run{{1, 2}}, 512, bytes.Repeat(page, 2)), bytes.Repeat(page, 2)...)
	out = append(out, withVersion(v2, 2))
	return out
}

// withVersion is frame with its version byte set to v and its header checksum redone, as
// a build speaking wire v sends the same fields.
func withVersion(frame []byte, v byte) []byte {
	b := bytes.Clone(frame)
	b[4] = v
	binary.LittleEndian.PutUint32(b[60:], crc32.Checksum(b[:60], castagnoli))
	return b
}

// encodeV2 is a header in the v2 layout, field by field from v2's table (wire.go before
// v3): whole-page frames kept every byte but the version in v3.
func encodeV2(h Header) []byte {
	b := make([]byte, HeaderSize)
	le := binary.LittleEndian
	le.PutUint32(b[0:], wireMagic)
	b[4] = 2
	b[5] = byte(h.Type)
	le.PutUint16(b[6:], h.Flags)
	le.PutUint64(b[8:], h.Room)
	le.PutUint64(b[16:], h.Nonce)
	le.PutUint32(b[24:], h.Seq)
	le.PutUint32(b[28:], h.Status)
	le.PutUint32(b[32:], h.NumRuns)
	le.PutUint32(b[36:], h.Pages)
	le.PutUint16(b[40:], h.Rank.TP)
	le.PutUint16(b[42:], h.Rank.Size)
	le.PutUint64(b[44:], h.PayloadLen)
	le.PutUint32(b[52:], h.PayloadCRC)
	le.PutUint32(b[56:], h.RunsCRC)
	le.PutUint32(b[60:], crc32.Checksum(b[:60], castagnoli))
	return b
}

// encodeV1 is a header in the v1 layout (buffer at 28, status at 40, no rank), as a build
// before wire v2 sends it.
func encodeV1(h Header, buffer uint32) []byte {
	b := make([]byte, HeaderSize)
	le := binary.LittleEndian
	le.PutUint32(b[0:], wireMagic)
	b[4] = 1
	b[5] = byte(h.Type)
	le.PutUint16(b[6:], h.Flags)
	le.PutUint64(b[8:], h.Room)
	le.PutUint64(b[16:], h.Nonce)
	le.PutUint32(b[24:], h.Seq)
	le.PutUint32(b[28:], buffer)
	le.PutUint32(b[32:], h.NumRuns)
	le.PutUint32(b[36:], h.Pages)
	le.PutUint32(b[40:], h.Status)
	le.PutUint64(b[44:], h.PayloadLen)
	le.PutUint32(b[52:], h.PayloadCRC)
	le.PutUint32(b[56:], h.RunsCRC)
	le.PutUint32(b[60:], crc32.Checksum(b[:60], castagnoli))
	return b
}

func FuzzDecodeHeader(f *testing.F) {
	for _, s := range seedFrames() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHeader(b)
		if err != nil {
			if !isWireSentinel(err) {
				t.Fatalf("non-sentinel error %v", err)
			}
			return
		}
		var again [HeaderSize]byte
		h.Encode(again[:])
		if !bytes.Equal(again[:], b[:HeaderSize]) {
			t.Fatalf("decode/encode round trip differs")
		}
	})
}

func FuzzDecodeRuns(f *testing.F) {
	for _, rs := range seedRuns() {
		f.Add(rs, uint32(len(rs)/runSize), RunsChecksum(rs))
	}
	f.Add([]byte{}, uint32(0), uint32(0))
	f.Fuzz(func(t *testing.T, b []byte, n uint32, crc uint32) {
		got, err := DecodeRuns(nil, b, n, crc)
		if err != nil {
			if !isWireSentinel(err) {
				t.Fatalf("non-sentinel error %v", err)
			}
			return
		}
		if uint32(len(got)) != n || !bytes.Equal(AppendRuns(nil, got), b) {
			t.Fatalf("round trip differs")
		}
	})
}

// FuzzDecodeSliceRuns: hostile sliced run lists never panic, fail with a wire sentinel,
// and every entry decoded lies inside its row; a decoded list encodes back to its bytes.
func FuzzDecodeSliceRuns(f *testing.F) {
	for _, rs := range seedSliceRuns() {
		f.Add(rs, uint32(len(rs)/sliceRunSize), RunsChecksum(rs))
	}
	f.Fuzz(func(t *testing.T, b []byte, n uint32, crc uint32) {
		got, err := DecodeSliceRuns(nil, b, n, crc)
		if err != nil {
			if !isWireSentinel(err) {
				t.Fatalf("non-sentinel error %v", err)
			}
			return
		}
		for _, r := range got {
			if r.Heads == 0 || r.HeadBytes == 0 || (uint64(r.DstHead)+uint64(r.Heads))*uint64(r.HeadBytes) > uint64(r.RowBytes) {
				t.Fatalf("decoded a slice outside its row: %+v", r)
			}
		}
		if uint32(len(got)) != n || !bytes.Equal(AppendSliceRuns(nil, got), b) {
			t.Fatalf("round trip differs")
		}
	})
}

// seedSliceRuns are encoded sliced run lists: the fuzz room's, and one slice past its row.
func seedSliceRuns() [][]byte {
	past := fuzzSliceRuns[0]
	past.DstHead = 3
	return [][]byte{AppendSliceRuns(nil, fuzzSliceRuns), AppendSliceRuns(nil, []SliceRun{past})}
}

// FuzzReceiverStream feeds arbitrary bytes to a live receiver connection: it never panics,
// and no byte lands outside the registered rooms' pages, nor, in the room of head slices,
// outside the heads it expects.
func FuzzReceiverStream(f *testing.F) {
	for _, s := range seedFrames() {
		f.Add(s)
	}
	const item = 512
	l := UniformLayout(2, 8, item, 1, 16)
	dst := openTestRegion(f, l)
	rcv, err := NewReceiver(dst, ReceiverConfig{IdleTimeout: time.Second}, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { rcv.Close() })
	k := fuzzKey
	other := k
	other.Rank.TP = 0 // the room's other rank: expected, and never written by frames of k
	f.Fuzz(func(t *testing.T, b []byte) {
		memset(dst.Buffer(0), 0xAA)
		memset(dst.Buffer(1), 0xAA)
		rcv.Fence(k)
		rcv.Fence(other)
		if err := rcv.Expect(Expectation{Key: k, Dst: [][]Run{{{1, 2}}, {{3, 1}}}, AuxRow: 0}); err != nil {
			t.Fatal(err)
		}
		if err := rcv.Expect(Expectation{Key: other, Dst: [][]Run{{{4, 2}}, {{0, 1}}}, AuxRow: -1}); err != nil {
			t.Fatal(err)
		}
		rcv.Fence(fuzzSlicedKey)
		if err := rcv.Expect(Expectation{Key: fuzzSlicedKey, Dst: [][]Run{{{6, 1}}, {{7, 1}}}, AuxRow: -1, Copies: fuzzSlices}); err != nil {
			t.Fatal(err)
		}
		rcv.Fence(fuzzFromKey)
		if err := rcv.Expect(Expectation{Key: fuzzFromKey, Dst: [][]Run{{{6, 1}}, {{7, 1}}}, AuxRow: -1, Copies: fuzzFromSlices}); err != nil {
			t.Fatal(err)
		}
		client, server := net.Pipe()
		rcv.ServeConn(server)
		go func() { // answers (results, pongs) are read and dropped
			buf := make([]byte, 256)
			for {
				if _, err := client.Read(buf); err != nil {
					return
				}
			}
		}()
		client.SetWriteDeadline(time.Now().Add(2 * time.Second))
		client.Write(b)
		client.Close()
		waitFor(t, func() bool { rcv.mu.Lock(); defer rcv.mu.Unlock(); return len(rcv.conns) == 0 })
		// Frames may name either rank of the room; no byte may land outside their pages.
		var outside []byte
		for _, p := range []struct {
			buf int
			run Run
		}{{0, Run{0, 1}}, {0, Run{3, 1}}, {0, Run{7, 1}}, {1, Run{1, 2}}, {1, Run{4, 3}}} {
			outside = append(outside, dst.Pages(p.buf, p.run)...)
		}
		// The sliced streams' pages: only their heads' bytes of each 128-byte row may change.
		for b := range 2 {
			page := dst.Pages(b, Run{int32(6 + b), 1})
			for tok := range 4 {
				row := page[tok*128 : (tok+1)*128]
				for at := range row {
					covered := false
					for _, c := range slices.Concat(fuzzSlices, fuzzFromSlices) {
						covered = covered || (c.Buffer == b && at >= c.DstHead*c.HeadBytes && at < (c.DstHead+c.Heads)*c.HeadBytes)
					}
					if !covered {
						outside = append(outside, row[at])
					}
				}
			}
		}
		if !bytes.Equal(outside, bytes.Repeat([]byte{0xAA}, len(outside))) {
			t.Fatal("bytes landed outside the rooms' pages")
		}
	})
}

// seedRuns are encoded run lists: one buffer, and several buffers out of order.
func seedRuns() [][]byte {
	return [][]byte{
		AppendRuns(nil, []ChunkRun{{0, Run{0, 1}}, {0, Run{5, 3}}}),
		AppendRuns(nil, []ChunkRun{{3, Run{0, 1}}, {0, Run{5, 3}}, {63, Run{7, 1}}}),
	}
}

// TestWriteFuzzSeedCorpus regenerates testdata/fuzz from seedFrames when
// PDLINK_WRITE_FUZZ_SEEDS=1.
func TestWriteFuzzSeedCorpus(t *testing.T) {
	if os.Getenv("PDLINK_WRITE_FUZZ_SEEDS") != "1" {
		t.Skip("set PDLINK_WRITE_FUZZ_SEEDS=1 to rewrite testdata/fuzz")
	}
	for _, target := range []string{"FuzzDecodeHeader", "FuzzReceiverStream"} {
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, s := range seedFrames() {
			body := "go test fuzz v1\n[]byte(" + strconv.Quote(string(s)) + ")\n"
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%d", i)), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	for target, seeds := range map[string]struct {
		lists [][]byte
		size  int
	}{"FuzzDecodeRuns": {seedRuns(), runSize}, "FuzzDecodeSliceRuns": {seedSliceRuns(), sliceRunSize}} {
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, rs := range seeds.lists {
			body := fmt.Sprintf("go test fuzz v1\n[]byte(%s)\nuint32(%d)\nuint32(%d)\n", strconv.Quote(string(rs)), len(rs)/seeds.size, RunsChecksum(rs))
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%d", i)), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// slicedChunkHeader is the header and run list of a sliced chunk whose destination pages
// hold pageTokens tokens, with the crc32c of payload.
func slicedChunkHeader(k Key, seq uint32, runs []SliceRun, pageTokens int64, payload []byte) []byte {
	meta := AppendSliceRuns(make([]byte, HeaderSize), runs)
	var pages, n int64
	for _, r := range runs {
		pages += int64(r.Count)
		n += int64(r.Count) * r.sliceBytes(pageTokens)
	}
	h := Header{Type: FrameChunk, Flags: FlagPayloadCRC | FlagSliced, Room: k.Room, Nonce: k.Nonce, Rank: k.Rank, From: k.From, Seq: seq,
		NumRuns: uint32(len(runs)), Pages: uint32(pages), PayloadLen: uint64(n),
		PayloadCRC: crc32.Checksum(payload, castagnoli), RunsCRC: RunsChecksum(meta[HeaderSize:])}
	h.Encode(meta)
	return meta
}
