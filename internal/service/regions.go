package service

import (
	"fmt"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
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
}

func (s *regionSlot) register(path string, l *pb.RegionLayout) (string, error) {
	if path == "" {
		return "", invalid("region_path", "required")
	}
	layout, err := layoutFromProto("layout", l)
	if err != nil {
		return "", err
	}
	if layout.TPSize != 1 {
		return "", status.Errorf(codes.Unimplemented, "layout.rank: tp_size %d: one rank per daemon until fan-out lands", layout.TPSize)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.region != nil {
		if s.region.Path() == path && s.region.Layout().Compatible(layout) == nil {
			return regionID(layout), nil
		}
		return "", status.Errorf(codes.AlreadyExists, "rank %d already registered as %s", layout.TPRank, s.region.Path())
	}
	r, err := transfer.OpenRegion(path, layout)
	if err != nil {
		return "", invalid("region_path", "%v", err)
	}
	if s.onSet != nil {
		if err := s.onSet(r); err != nil {
			r.Close()
			return "", status.Errorf(codes.Internal, "start data plane: %v", err)
		}
	}
	s.region, s.proto = r, l
	return regionID(layout), nil
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

func regionID(l transfer.Layout) string { return fmt.Sprintf("tp%d-of-%d", l.TPRank, l.TPSize) }
