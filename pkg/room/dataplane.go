package room

import (
	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/conn"
	"github.com/pdlink/pdlink/pkg/poll"
)

// Rank names one tensor-parallel rank of an engine: rank TP of Size. It
// is the proto's Rank (tp_rank, tp_size); Size 0 there means 0 of 1.
type Rank struct{ TP, Size uint16 }

// rankOf reads a frame's rank, already checked (validateRank) to fit.
func rankOf(r *pdlinkv1.Rank) Rank {
	return Rank{TP: uint16(r.GetTpRank()), Size: uint16(max(r.GetTpSize(), 1))}
}

func (r Rank) proto() *pdlinkv1.Rank {
	return &pdlinkv1.Rank{TpRank: uint32(r.TP), TpSize: uint32(r.Size)}
}

// Metadata is one decode rank's METADATA for a room: where that rank's
// pages go.
type Metadata struct {
	Key poll.Key
	// Rank is the decode rank whose pages these are (0 of 1 when absent).
	Rank     Rank
	DstPages *pdlinkv1.PageList
	AuxIndex uint32
	// PrefixLen is how many leading positions of DstPages decode already
	// holds: no bytes move for them.
	PrefixLen uint32
	// ExpectedRanks is how many distinct prefill ranks must finish before
	// decode reports Success (R11). The frame's field keeps its old name,
	// expected_senders, for compatibility.
	ExpectedRanks int
	// PrefillTP is the prefill side's TP size the room's ranks were opened
	// with (expected_senders); 0 when unknown. Decode plans the head slices
	// each prefill rank brings from it and its own layout (MHA between TP
	// sizes).
	PrefillTP int
}

// PrefillDataPlane is what the prefill node needs from the data plane:
// PrefillData over package transfer, or a test's fake. Calls come from the
// owner goroutine (outside the table lock) and must not block.
//
// Fence must be sticky and must not wait: it marks the room stopped (no
// worker starts reading the room's source pages after it, and a Bind for
// that key that arrives later, they may race, is ignored) and returns.
// It returns true when no worker holds the room any more; false when one
// still does, and then the data plane calls the node's Fenced(key) once
// that worker let go, from any goroutine. The room's Failed state stays
// invisible until then (I9). Forget drops everything kept for the key; it
// must not wait either.
type PrefillDataPlane interface {
	// Bind records where a room's pages go once prefill applied decode's
	// METADATA: the decode peer (its data endpoint and layouts) and that
	// rank's metadata. It is called once per applied METADATA (a rank may
	// be bound again after a retransmit: Bind must be idempotent).
	Bind(peer conn.PeerInfo, md Metadata)
	Fence(key poll.Key) (done bool)
	Forget(key poll.Key)
}

// DecodeDataPlane is what the decode node needs from the data plane. Same
// rules as PrefillDataPlane: Fence is sticky (an Expect after Fence of the
// same key is refused) and returns at once, false meaning Fenced(key)
// follows once no worker writes the room's pages; Fence and Forget come
// from the owner goroutine, Expect from SendMetadata's caller.
type DecodeDataPlane interface {
	// Expect prepares the receiver for one rank's pages of a room before
	// its METADATA leaves; an error (bad pages for the region) fails
	// SendMetadata with it.
	Expect(md Metadata) error
	Fence(key poll.Key) (done bool)
	Forget(key poll.Key)
}
