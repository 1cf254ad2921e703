package transfer

import (
	"encoding/binary"
	"fmt"
)

// Same-host frames (doc.go, "Same-host pages"). On the wire they are v3 frames of new types
// and one new chunk flag; a TCP-only peer never sends them.
const (
	// FrameShmOffer (sender -> receiver): Rank is the source rank, Seq the offer id (unique
	// on the connection), the payload a ShmOffer (PayloadCRC always set).
	FrameShmOffer FrameType = 6
	// FrameShmAnswer (receiver -> sender): Seq the offer id, Status 0 accepted, else a
	// ShmFallback code; Pages, when accepted, the ShmCaps of the decode that answers.
	FrameShmAnswer FrameType = 7
	// FrameCopied (receiver -> sender): the shm chunk Key/Seq was copied, refused or
	// discarded; its bytes go back to the sender's budget.
	FrameCopied FrameType = 8
)

// FlagShm marks a chunk whose run list is ShmRuns (ShmSliceRuns with FlagSliced, a stream
// of head slices) and which has no payload: the receiver copies the pages from the prefill
// region.
const FlagShm uint16 = 4

// shmRunSize is the wire size of a ShmRun: five u32.
const shmRunSize = 20

// shmOfferFixed is the fixed part of an offer's payload; maxShmPath and maxShmBuffers bound
// the rest.
const (
	shmOfferFixed = 40
	shmBufferSize = 24
	maxShmPath    = 4096
	maxShmBuffers = 4096
	maxShmOffer   = shmOfferFixed + maxShmPath + maxShmBuffers*shmBufferSize
)

// ShmOffer is what a SHM_OFFER proposes: the source rank region's file identity, the size
// decode must find, and where each buffer's pages are in it (offset, length, item_len:
// decode checks every source run against them). On the wire {dev, ino, generation, size
// u64, path_len, buffers u32, path, buffers x {offset, length, item_len u64}}.
type ShmOffer struct {
	ID      RegionID
	Size    int64
	Buffers []BufferSpec
}

// NewShmOffer is the offer for mapping m.
func NewShmOffer(m *Mapping) ShmOffer {
	o := ShmOffer{ID: m.ID(), Size: m.layout.Size()}
	for _, b := range m.layout.Buffers {
		o.Buffers = append(o.Buffers, BufferSpec{Offset: b.Offset, Length: b.Length, ItemLen: b.ItemLen})
	}
	return o
}

// AppendShmOffer appends o's wire form to dst.
func AppendShmOffer(dst []byte, o ShmOffer) []byte {
	le := binary.LittleEndian
	dst = le.AppendUint64(dst, o.ID.Dev)
	dst = le.AppendUint64(dst, o.ID.Ino)
	dst = le.AppendUint64(dst, o.ID.Generation)
	dst = le.AppendUint64(dst, uint64(o.Size))
	dst = le.AppendUint32(dst, uint32(len(o.ID.Path)))
	dst = le.AppendUint32(dst, uint32(len(o.Buffers)))
	dst = append(dst, o.ID.Path...)
	for _, b := range o.Buffers {
		dst = le.AppendUint64(dst, uint64(b.Offset))
		dst = le.AppendUint64(dst, uint64(b.Length))
		dst = le.AppendUint64(dst, uint64(b.ItemLen))
	}
	return dst
}

// DecodeShmOffer parses an offer's payload: a path of 1 to 4096 bytes without NUL, a
// positive size, at most 4096 buffers each with a positive item_len and inside the size.
// It never panics.
func DecodeShmOffer(b []byte) (ShmOffer, error) {
	if len(b) < shmOfferFixed || len(b) > maxShmOffer {
		return ShmOffer{}, fmt.Errorf("%w: %d bytes", ErrBadShmOffer, len(b))
	}
	le := binary.LittleEndian
	pathLen, nbuf := uint64(le.Uint32(b[32:])), uint64(le.Uint32(b[36:]))
	if pathLen == 0 || pathLen > maxShmPath || nbuf > maxShmBuffers ||
		uint64(len(b)) != shmOfferFixed+pathLen+nbuf*shmBufferSize {
		return ShmOffer{}, fmt.Errorf("%w: path of %d bytes, %d buffers in %d bytes", ErrBadShmOffer, pathLen, nbuf, len(b))
	}
	o := ShmOffer{ID: RegionID{Dev: le.Uint64(b), Ino: le.Uint64(b[8:]), Generation: le.Uint64(b[16:]),
		Path: string(b[shmOfferFixed : shmOfferFixed+pathLen])}, Size: int64(le.Uint64(b[24:]))}
	if o.Size <= 0 {
		return ShmOffer{}, fmt.Errorf("%w: size %d", ErrBadShmOffer, o.Size)
	}
	for i := 0; i < len(o.ID.Path); i++ {
		if o.ID.Path[i] == 0 {
			return ShmOffer{}, fmt.Errorf("%w: NUL in path", ErrBadShmOffer)
		}
	}
	for e := b[shmOfferFixed+pathLen:]; len(e) >= shmBufferSize; e = e[shmBufferSize:] {
		off, n, il := le.Uint64(e), le.Uint64(e[8:]), le.Uint64(e[16:])
		if il == 0 || off > uint64(o.Size) || n > uint64(o.Size)-off || il > uint64(o.Size) {
			return ShmOffer{}, fmt.Errorf("%w: buffer {offset %d, length %d, item_len %d} in %d bytes", ErrBadShmOffer, off, n, il, o.Size)
		}
		o.Buffers = append(o.Buffers, BufferSpec{Offset: int64(off), Length: int64(n), ItemLen: int64(il)})
	}
	return o, nil
}

// ShmFallback is why a connection's offer was refused: the closed set of the
// pdlink_shm_fallback_total reason label.
type ShmFallback uint32

// Fallback reasons (0 is accepted). Those up to maxShmAnswer travel as a SHM_ANSWER's
// status; the others are prefill's own.
const (
	ShmAccepted  ShmFallback = iota
	ShmDisabled              // decode runs --data-transport=tcp
	ShmOpen                  // decode cannot open the path (permissions, another mount namespace)
	ShmIdentity              // the file decode opened is another file (device or inode) or too small
	ShmMap                   // mmap failed, or the offer's layout cannot be served
	maxShmAnswer             = ShmMap
	// ShmNoSlices (prefill only): decode accepted the offer without ShmCapSlices (a build
	// before head slices went by shared memory), so the rank's sliced streams go by tcp on
	// the connection while its whole pages still go by shared memory.
	ShmNoSlices    ShmFallback = maxShmAnswer + 1
	maxShmFallback             = ShmNoSlices
)

// ShmCaps is what a decode that accepted an offer copies besides whole pages: a bit set in
// the SHM_ANSWER's pages field (header bytes 36-39). The build before head slices went by
// shared memory writes that field zero and never reads it, so each side of a mixed pair
// reads the other right: an old decode's answer says no slices, and an old prefill ignores
// the bits. Bits this build does not know are ignored, for the builds after it.
type ShmCaps uint32

const (
	// ShmCapSlices: decode copies sliced shm chunks (FlagShm|FlagSliced, ShmSliceRuns).
	// Without it prefill sends the rank's sliced streams with payload on the connection.
	ShmCapSlices ShmCaps = 1 << iota
	// shmCapsBuilt is what this build's decode copies.
	shmCapsBuilt = ShmCapSlices
)

// String is the reason label.
func (f ShmFallback) String() string {
	switch f {
	case ShmAccepted:
		return "accepted"
	case ShmDisabled:
		return "disabled"
	case ShmOpen:
		return "open"
	case ShmIdentity:
		return "identity"
	case ShmMap:
		return "map"
	case ShmNoSlices:
		return "no_slices"
	}
	return "unknown"
}

// AllShmFallbacks is every refusal reason, for metrics that list their labels up front.
func AllShmFallbacks() []ShmFallback {
	out := make([]ShmFallback, 0, maxShmFallback)
	for f := ShmDisabled; f <= maxShmFallback; f++ {
		out = append(out, f)
	}
	return out
}

// ShmRun is one entry of a shm chunk's run list: Count destination pages of Buffer from
// Start, copied from the source pages from SrcStart of the same buffer of the region the
// connection's offer Offer proved. On the wire {buffer, start, count, src_start, offer}.
type ShmRun struct {
	ChunkRun
	SrcStart int32
	Offer    uint32
}

// AppendShmRuns appends the wire form of a shm chunk's run list to dst.
func AppendShmRuns(dst []byte, runs []ShmRun) []byte {
	le := binary.LittleEndian
	for _, r := range runs {
		dst = le.AppendUint32(dst, r.Buffer)
		dst = le.AppendUint32(dst, uint32(r.Start))
		dst = le.AppendUint32(dst, uint32(r.Count))
		dst = le.AppendUint32(dst, uint32(r.SrcStart))
		dst = le.AppendUint32(dst, r.Offer)
	}
	return dst
}

// DecodeShmRuns parses n shm run-list entries from b (exactly n*20 bytes) after checking
// them against crc: non-negative starts and a positive count. It appends to dst[:0] and
// never panics.
func DecodeShmRuns(dst []ShmRun, b []byte, n uint32, crc uint32) ([]ShmRun, error) {
	if err := checkRunList(b, n, crc, shmRunSize); err != nil {
		return dst[:0], err
	}
	out := dst[:0]
	le := binary.LittleEndian
	for i := 0; i+shmRunSize <= len(b); i += shmRunSize {
		e := b[i : i+shmRunSize]
		r := ShmRun{ChunkRun: decodeChunkRun(e), SrcStart: int32(le.Uint32(e[12:])), Offer: le.Uint32(e[16:])}
		if r.Start < 0 || r.Count <= 0 || r.SrcStart < 0 {
			return out[:0], fmt.Errorf("%w: buffer %d run {start %d, count %d, src %d}", ErrEmptyRun, r.Buffer, r.Start, r.Count, r.SrcStart)
		}
		out = append(out, r)
	}
	return out, nil
}
