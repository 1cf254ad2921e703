package room

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/conn"
	"github.com/pdlink/pdlink/pkg/poll"
	"github.com/pdlink/pdlink/pkg/regionpath"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// retireWait bounds how long RegisterRegion and UnregisterRegion wait for
// the fences of the rooms on a retired mapping before they answer. The
// mapping is unmapped by the last fence to finish in any case, never
// before (I9): a writer held past the bound keeps writing into memory that
// is still mapped.
const retireWait = 10 * time.Second

// regionSlot holds the region a daemon serves for its rank (one rank
// today: the TP work keys these by rank). The transfer.Region handle is
// built once, with the data plane over it; each registered file is one
// transfer.Mapping in it, with its generation.
//
// A new generation (the file at the path was replaced, or another path or
// layout) retires the old mapping in this order: every room that holds
// data-plane state on it fails with region_replaced and is fenced, then
// the new mapping is installed (one owner input: a bind or Send after it
// sees the new file), then, once every one of those fences is done, the
// old mapping is unmapped. Unmapping while a fenced writer still copies
// would SIGSEGV the daemon.
type regionSlot struct {
	// mu serialises register and unregister across their whole procedure
	// (they wait for fences). The owner never takes it.
	mu     sync.Mutex
	region atomic.Pointer[transfer.Region]
	// vmu guards proto and gen, read by REGISTER and the edge.
	vmu   sync.Mutex
	proto *pb.RegionLayout
	gen   uint64
	// announced is the layout the peers last learned in REGISTER (set
	// at the first registration, which the link sends on its own).
	announced *pb.RegionLayout

	// onSet builds the data plane over the region, once.
	onSet func(*transfer.Region) error
	// retire fails and fences, as one owner input, every room holding
	// data-plane state on the current mapping with reason, runs swap in
	// the same input after the fences were asked for, and returns how
	// many rooms it failed. For each of those rooms it takes a hold and
	// calls the release it got once the room's fence is done.
	retire func(reason poll.Reason, swap func(), hold func() (release func())) int
	// onLayout tells the peers the new layouts (REGISTER again).
	onLayout func()

	log *zap.Logger
	// staleSeen is the last generation a changed file was logged for;
	// replacedRooms counts the rooms failed with region_replaced, and
	// replacements the files found replaced (RegionReplaced).
	staleSeen     atomic.Uint64
	replacedRooms atomic.Uint64
	replacements  atomic.Uint64

	// paths decides which files a region may be (nil: none).
	paths *regionpath.Checker
	// afterPathCheck, for tests, runs between the path check and the
	// mapping's own open of the path.
	afterPathCheck func(path string)
}

// RegionFile is a mapped region file's identity: path, device, inode and
// generation.
type RegionFile = transfer.RegionID

// Registered is what RegisterRegion answers: the region's id, the mapped
// file's identity (generation included) and how many rooms on the previous
// generation failed with region_replaced.
type Registered struct {
	ID          string
	File        RegionFile
	RoomsFailed int
}

// Unregistered is what UnregisterRegion answers; Dropped is false when the
// rank had no region (a repeat).
type Unregistered struct {
	Dropped     bool
	Generation  uint64
	RoomsFailed int
}

func (s *regionSlot) register(path string, l *pb.RegionLayout) (Registered, error) {
	if path == "" {
		return Registered{}, invalid("region_path", "required")
	}
	layout, err := layoutFromProto("layout", l)
	if err != nil {
		return Registered{}, err
	}
	if layout.Rank.Size != 1 {
		return Registered{}, errorf(ErrUnsupported, "layout.rank: tp_size %d: one rank per daemon until fan-out lands", layout.Rank.Size)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.region.Load()
	var cur *transfer.Mapping
	if r != nil {
		cur = r.Current()
	}
	// Idempotent only for the same file and the same layout: a layout that
	// changed (heads described, another page size) is a new generation, so
	// the peers learn it and no room runs on the old one.
	if cur != nil && cur.ID().Path == path && cur.Layout().Equal(layout) {
		if err := cur.Check(); err == nil {
			return Registered{ID: regionID(layout), File: cur.ID()}, nil // the same file: idempotent
		}
	}
	checked, err := checkRegionPath(s.paths, path)
	if err != nil {
		return Registered{}, err
	}
	if s.afterPathCheck != nil {
		s.afterPathCheck(path)
	}
	m, err := transfer.OpenMapping(path, layout)
	if err != nil {
		return Registered{}, invalid("region_path", "%v", err)
	}
	// The check opened the path once and the mapping again: the file
	// mapped must be the one the rules accepted.
	if err := confirmRegionPath(s.paths, path, checked, m.ID()); err != nil {
		m.Close()
		return Registered{}, err
	}
	s.vmu.Lock()
	gen := s.gen + 1
	s.vmu.Unlock()
	if r == nil {
		r = transfer.NewEmptyRegion()
		r.Replace(m, gen)
		if s.onSet != nil {
			if err := s.onSet(r); err != nil {
				r.Close()
				return Registered{}, errorf(ErrDataPlane, "start data plane: %v", err)
			}
		}
		s.region.Store(r)
		s.setVersion(l, gen)
		s.announced = l
		return Registered{ID: regionID(layout), File: m.ID()}, nil
	}
	if cur == nil { // unregistered: no room holds a mapping to retire
		r.Replace(m, gen)
		s.setVersion(l, gen)
		s.announce(l)
		return Registered{ID: regionID(layout), File: m.ID()}, nil
	}
	failed := s.retireMapping(r, func() {
		r.Replace(m, gen)
		s.setVersion(l, gen)
	})
	s.log.Info("region replaced", zap.String("region", path), zap.Uint64("generation", gen),
		zap.String("old_region", cur.ID().Path), zap.Uint64("old_generation", cur.ID().Generation), zap.Int("rooms_failed", failed))
	s.announce(l)
	return Registered{ID: regionID(layout), File: m.ID(), RoomsFailed: failed}, nil
}

// unregister drops rank's region: its rooms fail with region_replaced,
// are fenced, and the mapping is unmapped once the fences are done.
func (s *regionSlot) unregister(rank *pb.Rank) (Unregistered, error) {
	if err := conn.ValidateRank(rank); err != nil {
		return Unregistered{}, invalid("rank", "%v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.region.Load()
	if r == nil || r.Current() == nil {
		return Unregistered{}, nil
	}
	if want, have := transferRank(rank), r.Layout().Rank; want != have {
		return Unregistered{}, nil // no region for that rank: nothing to drop
	}
	gen := r.ID().Generation
	failed := s.retireMapping(r, func() {
		r.Replace(nil, 0)
		s.vmu.Lock()
		s.proto = nil
		s.vmu.Unlock()
	})
	// The peers keep the layout they have (no room opens here without a
	// region); the next registration tells them again, as a peer that
	// registered us meanwhile got none.
	s.announced = nil
	s.log.Info("region unregistered", zap.Uint64("generation", gen), zap.Int("rooms_failed", failed))
	return Unregistered{Dropped: true, Generation: gen, RoomsFailed: failed}, nil
}

// retireMapping fails and fences the rooms on r's current mapping, runs
// swap (which replaces it) in the same owner input, and unmaps the old
// mapping once every fence is done: here if they finish within
// retireWait, else on the owner when the last one does.
func (s *regionSlot) retireMapping(r *transfer.Region, swap func()) int {
	old := r.Current()
	s.replacements.Add(1)
	var pending atomic.Int64
	unmapped := make(chan struct{})
	release := func() {
		if pending.Add(-1) == 0 {
			if err := old.Close(); err != nil {
				s.log.Warn("unmap retired region", zap.Error(err))
			}
			close(unmapped)
		}
	}
	hold := func() func() {
		pending.Add(1)
		var once sync.Once
		return func() { once.Do(release) }
	}
	own := hold() // this call's, let go once swap ran
	failed := 0
	if s.retire != nil {
		failed = s.retire(poll.ReasonRegionReplaced, swap, hold)
	} else {
		swap()
	}
	s.replacedRooms.Add(uint64(failed))
	own()
	select {
	case <-unmapped:
	case <-time.After(retireWait):
		s.log.Warn("retired region still in use by fenced rooms: unmapped when their fences are done", zap.String("region", old.ID().Path))
	}
	return failed
}

// setVersion records the registered layout and generation.
func (s *regionSlot) setVersion(l *pb.RegionLayout, gen uint64) {
	s.vmu.Lock()
	defer s.vmu.Unlock()
	s.proto, s.gen = l, gen
}

// announce sends REGISTER again when l is not the layout the peers have.
// Under mu.
func (s *regionSlot) announce(l *pb.RegionLayout) {
	if s.announced != nil && layoutsEqual(s.announced, l) {
		return
	}
	s.announced = l
	if s.onLayout != nil {
		s.onLayout()
	}
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

// get returns the region while a file is registered for it (nil before
// the first RegisterRegion and after UnregisterRegion).
func (s *regionSlot) get() *transfer.Region {
	r := s.region.Load()
	if r == nil || r.Current() == nil {
		return nil
	}
	return r
}

// stale checks, with one stat, that the file the region maps is still the
// one mapped and whole, and names the reason a room about to bind or send
// must fail with instead of moving bytes through it: region_replaced for a
// file deleted or recreated at its path (the engine restarted and has not
// registered again), transfer_error for one truncated under the layout
// (its pages would fault). It logs once per generation.
func (s *regionSlot) stale(m *transfer.Mapping) (poll.Reason, bool) {
	err := m.Check()
	var reason poll.Reason
	switch {
	case err == nil:
		return poll.ReasonNone, false
	case errors.Is(err, transfer.ErrRegionReplaced):
		reason = poll.ReasonRegionReplaced
	case errors.Is(err, transfer.ErrRegionTooSmall):
		reason = poll.ReasonTransferError
	default:
		return poll.ReasonNone, false // the stat failed: the transfer finds out
	}
	if gen := m.ID().Generation; s.staleSeen.Swap(gen) != gen {
		if reason == poll.ReasonRegionReplaced {
			s.replacements.Add(1)
		}
		s.log.Warn("region file changed under its mapping: rooms fail until the engine registers it again",
			zap.String("region", m.ID().Path), zap.Uint64("generation", gen), zap.String("reason", string(reason)), zap.Error(err))
	}
	return reason, true
}

// RegionReplacedRooms is how many rooms failed with region_replaced.
func (s *regionSlot) RegionReplacedRooms() uint64 { return s.replacedRooms.Load() }

// RegionReplaced is how many region files were found replaced: a new
// generation registered, a rank unregistered, or a replaced file noticed
// at a bind or Send (once per generation).
func (s *regionSlot) RegionReplaced() uint64 { return s.replacements.Load() }

// RegionFaults is how many faults on the region's memory (its file
// truncated mid-copy) failed rooms instead of the daemon.
func (s *regionSlot) RegionFaults() uint64 {
	if r := s.region.Load(); r != nil {
		return r.Faults()
	}
	return 0
}

func (s *regionSlot) layouts() []*pb.RegionLayout {
	s.vmu.Lock()
	defer s.vmu.Unlock()
	if s.proto == nil {
		return nil
	}
	return []*pb.RegionLayout{s.proto}
}

// identity is the current mapping's identity (zero when none).
func (s *regionSlot) identity() transfer.RegionID {
	if r := s.region.Load(); r != nil {
		return r.ID()
	}
	return transfer.RegionID{}
}

func (s *regionSlot) close() {
	if r := s.region.Load(); r != nil {
		r.Close()
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

func layoutsEqual(a, b *pb.RegionLayout) bool {
	la, errA := layoutFromProto("layout", a)
	lb, errB := layoutFromProto("layout", b)
	return errA == nil && errB == nil && la.Rank == lb.Rank && la.Aux == lb.Aux && fmt.Sprint(la.Buffers) == fmt.Sprint(lb.Buffers)
}

func regionID(l transfer.Layout) string { return fmt.Sprintf("tp%d-of-%d", l.Rank.TP, l.Rank.Size) }

// retireRooms is a side's regionSlot.retire: as one owner input, it fails
// every live room of keys with reason (each step's effects fence the room
// and tell the peer), runs swap, then holds the retired mapping for each
// room of keys until its fence is done (a room failed earlier whose fence
// is still in progress included). A reaped room drops its fence and keeps
// its hold: the old mapping then stays mapped, which is safe.
func (c *core) retireRooms(keys func() []poll.Key, reason poll.Reason, swap func(), hold func() func()) int {
	failed := 0
	ran := c.execOwned(func() {
		ks := keys()
		for _, k := range ks {
			c.applyOwned(func() {
				in, err := c.t.Get(k.Room)
				if err != nil || in.Key != k || in.State.Terminal() {
					return
				}
				if c.t.Step(c.now(), poll.Event{Kind: poll.EvAbortLocal, Key: k, Reason: reason}) == nil {
					failed++
				}
			})
		}
		swap()
		for _, k := range ks {
			c.afterFence(k, hold())
		}
	})
	if !ran {
		swap() // the node stopped: its data plane is closed
	}
	return failed
}

// regionCalls is the region API both owners serve, over their slot.
type regionCalls struct{ slot *regionSlot }

// RegisterRegion maps the engine's region (building the data plane over it
// the first time) and answers its id and file identity. Registering the
// same file with the same layout again is a no-op; a replaced file,
// another path or another layout is a new generation and fails the rooms
// on the old one with region_replaced (regionSlot); on decode a new layout
// goes to the prefill daemons in REGISTER.
func (r regionCalls) RegisterRegion(path string, l *pb.RegionLayout) (Registered, error) {
	return r.slot.register(path, l)
}

// UnregisterRegion drops rank's region: its rooms fail with
// region_replaced, are fenced, and the file is unmapped. Dropped is false
// when the rank had none.
func (r regionCalls) UnregisterRegion(rank *pb.Rank) (Unregistered, error) {
	return r.slot.unregister(rank)
}

// Region is the identity of the mapped region file (zero when none).
func (r regionCalls) Region() RegionFile { return r.slot.identity() }

// RegionReplacedRooms is how many rooms failed with region_replaced.
func (r regionCalls) RegionReplacedRooms() uint64 { return r.slot.RegionReplacedRooms() }

// RegionReplaced is how many region files were found replaced
// (pdlink_region_replaced_total).
func (r regionCalls) RegionReplaced() uint64 { return r.slot.RegionReplaced() }

// RegionFaults is how many faults on the region's memory failed rooms
// instead of the daemon (pdlink_region_faults_total).
func (r regionCalls) RegionFaults() uint64 { return r.slot.RegionFaults() }
