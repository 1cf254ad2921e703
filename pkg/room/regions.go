package room

import (
	"fmt"
	"sync"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/conn"
	"github.com/pdlink/pdlink/pkg/poll"
	"github.com/pdlink/pdlink/pkg/regionpath"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// regionSlot holds the one region a daemon serves today. Layouts carry a
// tensor-parallel rank so fan-out can land without an API change; until
// then a second rank is refused with Unimplemented rather than mixed up.
type regionSlot struct {
	mu     sync.Mutex
	region *transfer.Region
	proto  *pb.RegionLayout
	onSet  func(*transfer.Region) error
	// paths decides which files a region may be (nil: none).
	paths *regionpath.Checker
}

func (s *regionSlot) register(path string, l *pb.RegionLayout) (string, error) {
	if path == "" {
		return "", invalid("region_path", "required")
	}
	layout, err := layoutFromProto("layout", l)
	if err != nil {
		return "", err
	}
	if layout.Rank.Size != 1 {
		return "", errorf(ErrUnsupported, "layout.rank: tp_size %d: one rank per daemon until fan-out lands", layout.Rank.Size)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.region != nil {
		if s.region.Path() == path && s.region.Layout().Compatible(layout) == nil {
			return regionID(layout), nil
		}
		return "", errorf(ErrRegionTaken, "rank %d already registered as %s", layout.Rank.TP, s.region.Path())
	}
	if err := checkRegionPath(s.paths, path); err != nil {
		return "", err
	}
	r, err := transfer.OpenRegion(path, layout)
	if err != nil {
		return "", invalid("region_path", "%v", err)
	}
	if s.onSet != nil {
		if err := s.onSet(r); err != nil {
			r.Close()
			return "", errorf(ErrDataPlane, "start data plane: %v", err)
		}
	}
	s.region, s.proto = r, l
	return regionID(layout), nil
}

// checkRank refuses a rank this daemon holds no region for
// (InvalidArgument naming field): a request for it could only fail later,
// on the peer or at a deadline. A nil rank, or tp_size 0, is rank 0 of 1.
// The caller has checked a region is registered.
func (s *regionSlot) checkRank(field string, r *pb.Rank) error {
	if err := conn.ValidateRank(r); err != nil {
		return invalid(field, "%v", err)
	}
	rank := transferRank(r)
	region := s.get()
	if region == nil {
		return ErrNoRegion
	}
	if l := region.Layout(); rank != l.Rank {
		return invalid(field, "tp_rank %d of tp_size %d: no region registered for it (this daemon serves %s)", rank.TP, rank.Size, regionID(l))
	}
	return nil
}

func (s *regionSlot) get() *transfer.Region {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.region
}

func (s *regionSlot) layouts() []*pb.RegionLayout {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proto == nil {
		return nil
	}
	return []*pb.RegionLayout{s.proto}
}

func (s *regionSlot) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.region != nil {
		s.region.Close()
	}
}

// key is the data-plane key of this daemon's share of the room: the rank
// of the region it serves (0 of 1 before one is registered). A transfer
// and its fence take their key from here, so a fence finds its transfer.
func (s *regionSlot) key(k poll.Key) transfer.Key {
	rank := transfer.Rank{TP: 0, Size: 1}
	if r := s.get(); r != nil {
		rank = r.Layout().Rank
	}
	return tkey(k, rank)
}

func regionID(l transfer.Layout) string { return fmt.Sprintf("tp%d-of-%d", l.Rank.TP, l.Rank.Size) }
