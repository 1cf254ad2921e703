package transfer

import (
	"maps"
	"sync"
	"sync/atomic"
)

// RegionSet resolves the region a data-plane key's rank reads from (Sender) or writes into
// (Receiver). One Sender or Receiver serves every TP rank of its daemon, so its connections
// and its in-flight budget stay per peer, not per rank; each stream or expectation takes
// its region from its Key.Rank when it is opened. A *Region is the set of one region that
// serves every rank (an engine without tensor parallelism, and the package's tests);
// *Regions holds one per rank.
type RegionSet interface {
	// ForRank is the region rank reads from or writes into; nil when the daemon serves no
	// such rank (the stream or expectation is refused with ErrNoRankRegion).
	ForRank(rank Rank) *Region
	// Shape is any served rank's layout (a daemon's ranks share their shape): what a peer's
	// layout is checked against. The zero Layout when none is mapped.
	Shape() Layout
}

// ForRank is r itself, for every rank.
func (r *Region) ForRank(Rank) *Region { return r }

// Shape is r's layout.
func (r *Region) Shape() Layout { return r.Layout() }

// Regions is a daemon's regions by TP rank. The hot path (ForRank at every Open and
// Expect) reads an immutable map without a lock; Set copies it.
type Regions struct {
	mu     sync.Mutex // serialises Set
	byRank atomic.Pointer[map[Rank]*Region]
}

var _ RegionSet = (*Regions)(nil)

// NewRegions returns an empty set.
func NewRegions() *Regions { return &Regions{} }

// normalRank reads tp_size 0 as 1, as the proto does.
func normalRank(r Rank) Rank {
	if r.Size == 0 {
		r.Size = 1
	}
	return r
}

// Set installs rank's region (nil removes it). A rank's Region is kept across its
// generations (Region.Replace), so Set is called once per rank the daemon serves.
func (s *Regions) Set(rank Rank, r *Region) {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := map[Rank]*Region{}
	if cur := s.byRank.Load(); cur != nil {
		next = maps.Clone(*cur)
	}
	if r == nil {
		delete(next, normalRank(rank))
	} else {
		next[normalRank(rank)] = r
	}
	s.byRank.Store(&next)
}

// ForRank implements RegionSet: the region set for rank, whatever it maps now (a Region
// with no mapping is still returned; its page accessors return nil).
func (s *Regions) ForRank(rank Rank) *Region {
	cur := s.byRank.Load()
	if cur == nil {
		return nil
	}
	return (*cur)[normalRank(rank)]
}

// Shape implements RegionSet: the layout of the lowest rank that has a mapping.
func (s *Regions) Shape() Layout {
	var best *Region
	var bestRank Rank
	if cur := s.byRank.Load(); cur != nil {
		for rank, r := range *cur {
			if r.Current() != nil && (best == nil || rank.TP < bestRank.TP) {
				best, bestRank = r, rank
			}
		}
	}
	if best == nil {
		return Layout{}
	}
	return best.Layout()
}

// All is every rank's region (for counters that sum over them).
func (s *Regions) All() []*Region {
	cur := s.byRank.Load()
	if cur == nil {
		return nil
	}
	out := make([]*Region, 0, len(*cur))
	for _, r := range *cur {
		out = append(out, r)
	}
	return out
}
