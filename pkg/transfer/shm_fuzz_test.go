package transfer

import (
	"bytes"
	"errors"
	"hash/crc32"
	"reflect"
	"testing"
)

func seedShmOffer() ShmOffer {
	return ShmOffer{ID: RegionID{Path: "/dev/shm/pdlink/prefill-0", Dev: 45, Ino: 1234, Generation: 2}, Size: 1 << 20,
		Buffers: []BufferSpec{{Offset: 0, Length: 1 << 19, ItemLen: 4096}, {Offset: 1 << 19, Length: 1 << 19, ItemLen: 4096}}}
}

// FuzzDecodeShmOffer: an offer payload never panics the decoder, is refused with
// ErrBadShmOffer, or decodes to an offer whose buffers lie inside its size and which
// encodes back to the same bytes.
func FuzzDecodeShmOffer(f *testing.F) {
	f.Add(AppendShmOffer(nil, seedShmOffer()))
	f.Add(AppendShmOffer(nil, ShmOffer{ID: RegionID{Path: "x"}, Size: 1}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		o, err := DecodeShmOffer(b)
		if err != nil {
			if !errors.Is(err, ErrBadShmOffer) {
				t.Fatalf("non-sentinel error %v", err)
			}
			return
		}
		for _, buf := range o.Buffers {
			if buf.ItemLen <= 0 || buf.Offset < 0 || buf.Length < 0 || buf.Offset+buf.Length > o.Size {
				t.Fatalf("buffer %+v outside an offer of %d bytes", buf, o.Size)
			}
		}
		if again := AppendShmOffer(nil, o); !bytes.Equal(again, b) {
			t.Fatalf("offer does not round-trip")
		}
	})
}

// FuzzDecodeShmRuns: a shm run list never panics the decoder, is refused with a wire
// sentinel, or decodes to runs with non-negative starts and positive counts that encode
// back to the same bytes.
func FuzzDecodeShmRuns(f *testing.F) {
	seed := AppendShmRuns(nil, []ShmRun{{ChunkRun: ChunkRun{Buffer: 1, Run: Run{Start: 3, Count: 2}}, SrcStart: 7, Offer: 1},
		{ChunkRun: ChunkRun{Buffer: 0, Run: Run{Start: 0, Count: 1}}, SrcStart: 0, Offer: 2}})
	f.Add(seed, uint32(2), RunsChecksum(seed))
	f.Add([]byte{}, uint32(0), uint32(0))
	f.Fuzz(func(t *testing.T, b []byte, n uint32, crc uint32) {
		got, err := DecodeShmRuns(nil, b, n, crc)
		if err != nil {
			if !isWireSentinel(err) {
				t.Fatalf("non-sentinel error %v", err)
			}
			return
		}
		for _, r := range got {
			if r.Start < 0 || r.Count <= 0 || r.SrcStart < 0 {
				t.Fatalf("decoded run %+v", r)
			}
		}
		if again := AppendShmRuns(nil, got); !bytes.Equal(again, b) {
			t.Fatal("runs do not round-trip")
		}
	})
}

// FuzzDecodeShmSliceRuns: a sliced shm run list never panics the decoder, is refused with
// a wire sentinel, or decodes to entries whose slice lies inside its row, with
// non-negative starts and positive counts, that encode back to the same bytes.
func FuzzDecodeShmSliceRuns(f *testing.F) {
	seed := AppendShmSliceRuns(nil, []ShmSliceRun{
		{SliceRun: fuzzSliceRuns[0], SrcStart: 3, Offer: 1},
		{SliceRun: fuzzSliceRuns[1], SrcStart: 0, Offer: 2},
	})
	f.Add(seed, uint32(2), RunsChecksum(seed))
	past := fuzzSliceRuns[0]
	past.DstHead = 3
	bad := AppendShmSliceRuns(nil, []ShmSliceRun{{SliceRun: past, SrcStart: 1, Offer: 1}})
	f.Add(bad, uint32(1), RunsChecksum(bad))
	f.Add([]byte{}, uint32(0), uint32(0))
	f.Fuzz(func(t *testing.T, b []byte, n uint32, crc uint32) {
		got, err := DecodeShmSliceRuns(nil, b, n, crc)
		if err != nil {
			if !isWireSentinel(err) {
				t.Fatalf("non-sentinel error %v", err)
			}
			return
		}
		for _, r := range got {
			if r.Start < 0 || r.Count <= 0 || r.SrcStart < 0 || r.checkShape() != nil {
				t.Fatalf("decoded entry %+v", r)
			}
		}
		if again := AppendShmSliceRuns(nil, got); !bytes.Equal(again, b) {
			t.Fatal("entries do not round-trip")
		}
	})
}

// FuzzShmHeaders: headers of the same-host frames (offer, answer, copied, shm chunk, sliced
// shm chunk) decode only with the fields their type allows, and re-encode to the same
// bytes.
func FuzzShmHeaders(f *testing.F) {
	k := fuzzKey
	payload := AppendShmOffer(nil, seedShmOffer())
	for _, h := range []Header{
		{Type: FrameShmOffer, Flags: FlagPayloadCRC, Rank: k.Rank, Seq: 1, PayloadLen: uint64(len(payload)),
			PayloadCRC: crc32.Checksum(payload, castagnoli)},
		{Type: FrameShmAnswer, Rank: k.Rank, Seq: 1, Status: uint32(ShmIdentity)},
		{Type: FrameShmAnswer, Rank: k.Rank, Seq: 2, Pages: uint32(ShmCapSlices)},
		{Type: FrameShmAnswer, Rank: k.Rank, Seq: 3, Pages: ^uint32(0)}, // caps of a later build
		{Type: FrameCopied, Room: k.Room, Nonce: k.Nonce, Rank: k.Rank, Seq: 4},
		{Type: FrameChunk, Flags: FlagPayloadCRC | FlagShm, Room: k.Room, Nonce: k.Nonce, Rank: k.Rank, NumRuns: 1, Pages: 2},
		{Type: FrameChunk, Flags: FlagPayloadCRC | FlagShm | FlagSliced, Room: k.Room, Nonce: k.Nonce, Rank: k.Rank,
			From: Rank{TP: 1, Size: 2}, NumRuns: 1, Pages: 2},
		{Type: FrameCopied, Room: k.Room, Nonce: k.Nonce, Rank: k.Rank, From: Rank{TP: 1, Size: 2}, Seq: 4},
	} {
		b := make([]byte, HeaderSize)
		h.Encode(b)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHeader(b)
		if err != nil {
			if !isWireSentinel(err) {
				t.Fatalf("non-sentinel error %v", err)
			}
			return
		}
		switch {
		case h.Flags&FlagShm != 0 && (h.Type != FrameChunk || h.PayloadLen != 0):
			t.Fatalf("shm flag accepted on %+v", h)
		case h.Type == FrameCopied && (h.Status != 0 || h.PayloadLen != 0):
			t.Fatalf("copied frame with status or payload: %+v", h)
		case h.Type == FrameShmAnswer && h.Status > uint32(maxShmAnswer):
			t.Fatalf("answer with unknown status: %+v", h)
		case h.Type == FrameShmOffer && (h.PayloadLen < shmOfferFixed || h.PayloadLen > maxShmOffer):
			t.Fatalf("offer of %d bytes accepted", h.PayloadLen)
		}
		var again [HeaderSize]byte
		h.Encode(again[:])
		h2, err := DecodeHeader(again[:])
		if err != nil || !reflect.DeepEqual(h, h2) {
			t.Fatalf("header does not round-trip: %+v, %v", h2, err)
		}
	})
}
