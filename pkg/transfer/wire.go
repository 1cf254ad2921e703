package transfer

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"

	"github.com/pdlink/pdlink/pkg/pagelist"
)

// Data-connection framing, wire v3. Every frame is a fixed 64-byte little-endian header,
// then for a chunk the run list (NumRuns x 12 bytes, or NumRuns x 32 for a sliced chunk),
// then PayloadLen bytes of payload:
//
//	off size field
//	  0    4 magic "PDKV"
//	  4    1 version (3)
//	  5    1 type (chunk, done, result, ping, pong)
//	  6    2 flags (bit 0: PayloadCRC is set; bit 1, chunk only: sliced run list; bit 2, chunk
//	               only: same-host, no payload, shm_wire.go)
//	  8    8 room
//	 16    8 nonce
//	 24    4 seq     chunk: sequence within the stream; done: number of chunks sent
//	 28    2 status  result: 0 ok, else a Reason code
//	 30    1 from_tp   chunk, done, result: the prefill rank of a sliced stream (Key.From)
//	 31    1 from_size 0 for a whole-page stream (from_tp then 0 too)
//	 32    4 runs    chunk: number of entries in the run list
//	 36    4 pages   chunk: page-buffer pairs in this chunk (sliced: page-slice pairs); done: in the stream;
//	                 shm answer: the decode's ShmCaps (shm_wire.go)
//	 40    2 tp_rank chunk, done, result: the rank the frame is about
//	 42    2 tp_size
//	 44    8 payload length in bytes (chunk: the pages' bytes; done: the aux row)
//	 52    4 payload crc32c
//	 56    4 run list crc32c
//	 60    4 header crc32c over bytes 0..59
//
// A run-list entry is {buffer u32, start u32, count u32}: count consecutive destination pages
// of one buffer. A chunk's entries may name several buffers, in any order, and its payload is
// their pages in entry order; so a one-page room of 64 buffers is one chunk of 64 entries
// (the entry's buffer costs 4 bytes per run, less than a 64-byte header per buffer). Room,
// nonce and rank make the frame's Key: two ranks of one room are two streams on the wire.
//
// The header checksum is always on (whatever the payload checksum setting) and the run list
// has its own, so a corrupted header or run list is refused before a single payload byte is
// placed: it cannot steer bytes into another room's (or rank's) pages. Frames of another
// version are refused with ErrBadVersion (v1: no rank, one buffer per chunk; v2: no sliced
// chunks, its bytes otherwise the same as v3's): both daemons ship together.
//
// A sliced chunk (FlagSliced, wire_slices.go) moves head slices between TP sizes: its
// entries are SliceRuns, whole-page entries plus the slice every page carries. A decode
// rank may take several prefill ranks' slices (MHA 4 -> 2), so a sliced stream's frames
// name their prefill rank too (from_tp, from_size: Key.From), in the two high bytes of the
// old 4-byte status, which never held more than a reason code: a whole-page stream's from
// is zero, so its bytes are what they were (see doc.go, "Head slices").
const (
	// HeaderSize is the fixed size of a frame header.
	HeaderSize = 64
	// wireMagic is "PDKV" read as a little-endian uint32.
	wireMagic = 0x564B4450
	// WireVersion is the data-connection protocol version this build speaks, and the only
	// one it accepts.
	WireVersion = 3

	// maxRunsPerFrame bounds the run list a decoder will allocate for; the sender keeps a
	// chunk's entries, over all its buffers, within one page list's bound.
	maxRunsPerFrame = pagelist.MaxRuns
	// maxFrameMeta bounds small payloads (the aux row).
	maxFrameMeta = 1 << 20
	// maxChunkPayload bounds one chunk's payload.
	maxChunkPayload = 1 << 30
	runSize         = 12
)

// FrameType is the type byte of a frame.
type FrameType uint8

// Frame types.
const (
	FrameChunk  FrameType = 1 // pages of one or more buffers of one room's rank
	FrameDone   FrameType = 2 // end of a stream: totals and the aux row
	FrameResult FrameType = 3 // receiver -> sender: the stream's outcome
	FramePing   FrameType = 4 // sender -> receiver keepalive
	FramePong   FrameType = 5 // receiver -> sender keepalive reply
)

// FlagPayloadCRC says PayloadCRC holds the crc32c of the payload.
const FlagPayloadCRC uint16 = 1

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Header is a decoded frame header.
type Header struct {
	Type    FrameType
	Flags   uint16
	Room    uint64
	Nonce   uint64
	Seq     uint32
	Status  uint32
	NumRuns uint32
	Pages   uint32
	Rank    Rank
	// From is Key.From: the prefill rank of a sliced stream, zero for whole pages.
	From       Rank
	PayloadLen uint64
	PayloadCRC uint32
	RunsCRC    uint32
}

// Key is the stream the frame is about: room, nonce and rank.
func (h *Header) Key() Key { return Key{Room: h.Room, Nonce: h.Nonce, Rank: h.Rank, From: h.From} }

// maxFromSize is the largest prefill TP size a frame's from_size byte holds (rankmap.MaxTP
// is below it).
const maxFromSize = 255

// Encode writes h into b[:HeaderSize], including the header checksum.
func (h *Header) Encode(b []byte) {
	_ = b[HeaderSize-1]
	le := binary.LittleEndian
	le.PutUint32(b[0:], wireMagic)
	b[4] = WireVersion
	b[5] = byte(h.Type)
	le.PutUint16(b[6:], h.Flags)
	le.PutUint64(b[8:], h.Room)
	le.PutUint64(b[16:], h.Nonce)
	le.PutUint32(b[24:], h.Seq)
	le.PutUint16(b[28:], uint16(h.Status))
	b[30] = byte(h.From.TP)
	b[31] = byte(h.From.Size)
	le.PutUint32(b[32:], h.NumRuns)
	le.PutUint32(b[36:], h.Pages)
	le.PutUint16(b[40:], h.Rank.TP)
	le.PutUint16(b[42:], h.Rank.Size)
	le.PutUint64(b[44:], h.PayloadLen)
	le.PutUint32(b[52:], h.PayloadCRC)
	le.PutUint32(b[56:], h.RunsCRC)
	le.PutUint32(b[60:], crc32.Checksum(b[:60], castagnoli))
}

// DecodeHeader parses and checks a frame header: magic, version, header checksum, type,
// flags and that the length fields fit the frame type and the protocol limits. It never
// panics and returns one of the wire sentinel errors.
func DecodeHeader(b []byte) (Header, error) {
	var h Header
	if len(b) < HeaderSize {
		return h, ErrShortFrame
	}
	le := binary.LittleEndian
	if le.Uint32(b[0:]) != wireMagic {
		return h, ErrBadMagic
	}
	if b[4] != WireVersion {
		return h, fmt.Errorf("%w: version %d, this build speaks %d", ErrBadVersion, b[4], WireVersion)
	}
	if le.Uint32(b[60:]) != crc32.Checksum(b[:60], castagnoli) {
		return h, ErrHeaderChecksum
	}
	h = Header{
		Type:       FrameType(b[5]),
		Flags:      le.Uint16(b[6:]),
		Room:       le.Uint64(b[8:]),
		Nonce:      le.Uint64(b[16:]),
		Seq:        le.Uint32(b[24:]),
		Status:     uint32(le.Uint16(b[28:])),
		From:       Rank{TP: uint16(b[30]), Size: uint16(b[31])},
		NumRuns:    le.Uint32(b[32:]),
		Pages:      le.Uint32(b[36:]),
		Rank:       Rank{TP: le.Uint16(b[40:]), Size: le.Uint16(b[42:])},
		PayloadLen: le.Uint64(b[44:]),
		PayloadCRC: le.Uint32(b[52:]),
		RunsCRC:    le.Uint32(b[56:]),
	}
	if h.Flags&^(FlagPayloadCRC|FlagSliced|FlagShm) != 0 || (h.Flags&(FlagSliced|FlagShm) != 0 && h.Type != FrameChunk) {
		return h, fmt.Errorf("%w: flags %#x on a frame of type %d", ErrBadFrameType, h.Flags, h.Type)
	}
	if (h.From.Size == 0 && h.From.TP != 0) || (h.From.Size != 0 && h.From.TP >= h.From.Size) {
		return h, fmt.Errorf("%w: from rank %d of %d", ErrBadFrameType, h.From.TP, h.From.Size)
	}
	if h.Type != FrameResult && h.Type != FrameShmAnswer && h.Status != 0 {
		return h, fmt.Errorf("%w: status on a frame of type %d", ErrBadFrameType, h.Type)
	}
	switch h.Type {
	case FrameChunk:
		if h.NumRuns == 0 || h.Pages == 0 {
			return h, fmt.Errorf("%w: empty chunk", ErrBadFrameType)
		}
		if h.NumRuns > maxRunsPerFrame || h.Pages > pagelist.MaxPages || h.PayloadLen > maxChunkPayload {
			return h, fmt.Errorf("%w: %d runs, %d pages, %d bytes", ErrFrameTooLarge, h.NumRuns, h.Pages, h.PayloadLen)
		}
		if h.Flags&FlagShm != 0 && h.PayloadLen != 0 {
			return h, fmt.Errorf("%w: shm chunk with %d payload bytes", ErrBadFrameType, h.PayloadLen)
		}
	case FrameDone:
		if h.NumRuns != 0 {
			return h, fmt.Errorf("%w: done with runs", ErrBadFrameType)
		}
		if h.PayloadLen > maxFrameMeta {
			return h, fmt.Errorf("%w: aux row %d bytes", ErrFrameTooLarge, h.PayloadLen)
		}
	case FrameResult:
		if h.NumRuns != 0 || h.PayloadLen != 0 || h.Status > uint32(maxReasonCode) {
			return h, fmt.Errorf("%w: malformed result", ErrBadFrameType)
		}
	case FrameShmOffer:
		if h.NumRuns != 0 || h.PayloadLen < shmOfferFixed || h.PayloadLen > maxShmOffer || h.Flags != FlagPayloadCRC {
			return h, fmt.Errorf("%w: malformed shm offer", ErrBadFrameType)
		}
	case FrameShmAnswer, FrameCopied:
		if h.NumRuns != 0 || h.PayloadLen != 0 || h.Flags != 0 || h.Status > uint32(maxShmAnswer) ||
			(h.Type == FrameCopied && h.Status != 0) {
			return h, fmt.Errorf("%w: malformed shm answer", ErrBadFrameType)
		}
	case FramePing, FramePong:
		if h.NumRuns != 0 || h.PayloadLen != 0 || h.Rank != (Rank{}) || h.From != (Rank{}) {
			return h, fmt.Errorf("%w: keepalive with payload or rank", ErrBadFrameType)
		}
	default:
		return h, fmt.Errorf("%w: %d", ErrBadFrameType, h.Type)
	}
	return h, nil
}

// ChunkRun is one entry of a chunk's run list: Count consecutive pages of buffer Buffer
// from page Start.
type ChunkRun struct {
	Buffer uint32
	Run
}

// AppendRuns appends the wire form of a chunk's run list to dst.
func AppendRuns(dst []byte, runs []ChunkRun) []byte {
	for _, r := range runs {
		dst = binary.LittleEndian.AppendUint32(dst, r.Buffer)
		dst = binary.LittleEndian.AppendUint32(dst, uint32(r.Start))
		dst = binary.LittleEndian.AppendUint32(dst, uint32(r.Count))
	}
	return dst
}

// RunsChecksum is the crc32c of an encoded run list.
func RunsChecksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// DecodeRuns parses n run-list entries from b (exactly n*12 bytes) after checking them
// against crc. Each run must have a non-negative start and a positive count; buffer, range
// and repeat checks against a region are the receiver's job. It appends to dst[:0] to reuse
// its storage. It never panics.
func DecodeRuns(dst []ChunkRun, b []byte, n uint32, crc uint32) ([]ChunkRun, error) {
	if err := checkRunList(b, n, crc, runSize); err != nil {
		return dst[:0], err
	}
	out := dst[:0]
	for i := 0; i+runSize <= len(b); i += runSize {
		r := decodeChunkRun(b[i:])
		if r.Start < 0 || r.Count <= 0 {
			return out[:0], fmt.Errorf("%w: buffer %d run {start %d, count %d}", ErrEmptyRun, r.Buffer, r.Start, r.Count)
		}
		out = append(out, r)
	}
	return out, nil
}

// checkRunList is every run-list decoder's check of the list as a whole: 1 to
// maxRunsPerFrame entries of entry bytes each, exactly, matching crc.
func checkRunList(b []byte, n uint32, crc uint32, entry int) error {
	if n == 0 || n > maxRunsPerFrame {
		return fmt.Errorf("%w: %d runs", ErrFrameTooLarge, n)
	}
	if uint64(len(b)) != uint64(n)*uint64(entry) {
		return ErrShortFrame
	}
	if RunsChecksum(b) != crc {
		return ErrRunsChecksum
	}
	return nil
}

// decodeChunkRun reads the {buffer, start, count} every run-list entry starts with.
func decodeChunkRun(e []byte) ChunkRun {
	le := binary.LittleEndian
	return ChunkRun{Buffer: le.Uint32(e), Run: Run{Start: int32(le.Uint32(e[4:])), Count: int32(le.Uint32(e[8:]))}}
}
