package conn

import (
	"time"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/poll"
)

// PeerInfo describes a peer daemon instance.
type PeerInfo struct {
	ID       poll.PeerID
	Instance string
	Epoch    uint64
	// Addr is the prefill bootstrap address (decode side) or the decode
	// data endpoint (prefill side).
	Addr string
	// Layouts are the decode region layouts sent in REGISTER (prefill side).
	Layouts   []*pdlinkv1.RegionLayout
	Up        bool
	LastHeard time.Time
}

// ValidateRank checks a rank as the peer checks the frame that carries it
// (an absent rank is rank 0 of 1), so the sender refuses one the peer
// would reject.
func ValidateRank(r *pdlinkv1.Rank) error { return validateRank(r) }
