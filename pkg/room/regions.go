package room

import (
	"errors"
	"fmt"
	"slices"
	"strings"
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

// regionSlot holds the regions a daemon serves, one per TP rank, all of
// one tp_size (rank 0 of 2 then rank 0 of 4 is refused naming layout.rank
// unless the first was unregistered). Each rank's transfer.Region handle
// is built once and kept in one transfer.Regions; the data plane (one
// Sender or Receiver for the daemon, whose connections and in-flight
// budget are per peer) is built over that set at the first registration
// and resolves each stream's or expectation's region by its key's rank.
// Each registered file is one transfer.Mapping in its rank's Region, with
// the rank's own generation.
//
// A rank's new generation (the file at the path was replaced, or another
// path or layout) retires that rank's old mapping in this order: every
// room that holds data-plane state on that rank fails with
// region_replaced and is fenced (a room spans all ranks, so such a room
// fails whole; rooms with no state on that rank yet are untouched), then
// the new mapping is installed (one owner input: a bind or Send after it
// sees the new file), then, once every one of those fences is done, the
// old mapping is unmapped. Unmapping while a fenced writer still copies
// would SIGSEGV the daemon.
type regionSlot struct {
	// mu serialises register and unregister across their whole procedure
	// (they wait for fences). The owner never takes it.
	mu sync.Mutex
	// regions is every rank's Region, built once per rank (set: made on
	// first use, read by the counters without mu).
	regionsOnce sync.Once
	regions     *transfer.Regions
	// built is set once the data plane is built over regions (under mu).
	built bool
	// vmu guards ranks, read by REGISTER, the edge and the owner.
	vmu   sync.RWMutex
	ranks map[transfer.Rank]*rankRegion
	// announced is the layouts the peers last learned in REGISTER (set
	// at the first registration, which the link sends on its own).
	announced []*pb.RegionLayout

	// onSet builds the data plane over the regions, once, at the first
	// registration (first is the region it registered).
	onSet func(set transfer.RegionSet, first *transfer.Region) error
	// retire fails and fences, as one owner input, every room holding
	// data-plane state on rank's current mapping with reason, runs swap
	// in the same input after the fences were asked for, and returns how
	// many rooms it failed. For each of those rooms it takes a hold and
	// calls the release it got once the room's fence is done.
	retire func(rank transfer.Rank, reason poll.Reason, swap func(), hold func() (release func())) int
	// onLayout tells the peers the new layouts (REGISTER again).
	onLayout func()

	log *zap.Logger
	// replacedRooms counts the rooms failed with region_replaced, and
	// replacements the files found replaced (RegionReplaced).
	replacedRooms atomic.Uint64
	replacements  atomic.Uint64

	// paths decides which files a region may be (nil: none).
	paths *regionpath.Checker
	// afterPathCheck, for tests, runs between the path check and the
	// mapping's own open of the path.
	afterPathCheck func(path string)
}

// rankRegion is one rank's region: its handle, the layout registered and
// its generation (proto nil while unregistered).
type rankRegion struct {
	region *transfer.Region
	proto  *pb.RegionLayout
	gen    uint64
	// staleSeen is the last generation a changed file was logged for.
	staleSeen atomic.Uint64
	// replacedGen is the last generation counted in replacements: a
	// generation's file is counted once, by whoever finds it replaced
	// first (a bind or Send, decode's same-host stat, the register or
	// unregister that retires it).
	replacedGen atomic.Uint64
	// failedEarly is how many rooms on the current generation failed
	// region_replaced before the register or unregister that retires it
	// (a bind or Send saw the file replaced, or decode's same-host stat
	// did); that call's rooms_failed counts them too. Changed only in
	// owner inputs, so a room counts here or in the retire, never both.
	failedEarly atomic.Int64
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

// rankOfLayout is the entry of rank, made on first use. Under mu.
func (s *regionSlot) entry(rank transfer.Rank) *rankRegion {
	s.vmu.Lock()
	defer s.vmu.Unlock()
	if s.ranks == nil {
		s.ranks = map[transfer.Rank]*rankRegion{}
	}
	e := s.ranks[rank]
	if e == nil {
		e = &rankRegion{}
		s.ranks[rank] = e
	}
	return e
}

// sizeHeld is the tp_size of the ranks registered now (0 when none is).
func (s *regionSlot) sizeHeld() uint16 {
	s.vmu.RLock()
	defer s.vmu.RUnlock()
	for rank, e := range s.ranks {
		if e.proto != nil {
			return rank.Size
		}
	}
	return 0
}

func (s *regionSlot) register(path string, l *pb.RegionLayout) (Registered, error) {
	if path == "" {
		return Registered{}, invalid("region_path", "required")
	}
	layout, err := layoutFromProto("layout", l)
	if err != nil {
		return Registered{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rank := layout.Rank
	if held := s.sizeHeld(); held != 0 && held != rank.Size {
		return Registered{}, invalid("layout.rank", "tp_size %d: this daemon serves tp_size %d (unregister every rank first)", rank.Size, held)
	}
	if other := s.get(); other != nil && other.Layout().Rank != rank {
		// A daemon's ranks share their shape: the peers' mapping is planned
		// from any one of them (transfer.PlanRanks compares two shapes).
		if _, err := transfer.PlanRanks(other.Layout(), layout); err != nil {
			return Registered{}, invalid("layout", "rank %d of %d does not have the shape of rank %d: %v", rank.TP, rank.Size, other.Layout().Rank.TP, err)
		}
	}
	e := s.entry(rank)
	r := e.region
	var cur *transfer.Mapping
	if r != nil {
		cur = r.Current()
	}
	// Idempotent only for the same file and the same layout: a layout that
	// changed (heads described, another page size) is a new generation, so
	// the peers learn it and no room runs on the old one. The same file
	// whole is the same generation, renewed: the engine vouches for it
	// again (once a file truncated under its layout has its size back, say),
	// so each same-host connection offers it again and decode proves it
	// again, instead of keeping what it found while the file was short.
	if cur != nil && cur.ID().Path == path && cur.Layout().Equal(layout) {
		if err := cur.Check(); err == nil {
			cur.Renew()
			s.log.Info("region registered again", zap.String("region", path), zap.Uint64("generation", cur.ID().Generation),
				zap.Stringer("rank", rankName(rank)), zap.Uint64("renewals", cur.Renewals()))
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
	s.vmu.RLock()
	gen := e.gen + 1
	s.vmu.RUnlock()
	if r == nil {
		r = transfer.NewEmptyRegion()
		r.Replace(m, gen)
		s.set().Set(rank, r)
		if !s.built && s.onSet != nil {
			if err := s.onSet(s.set(), r); err != nil {
				s.set().Set(rank, nil)
				r.Close()
				return Registered{}, errorf(ErrDataPlane, "start data plane: %v", err)
			}
		}
		s.vmu.Lock()
		e.region = r
		s.vmu.Unlock()
		s.setVersion(e, l, gen)
		if !s.built {
			s.built = true
			s.announced = s.layouts()
			return Registered{ID: regionID(layout), File: m.ID()}, nil
		}
		s.announce()
		return Registered{ID: regionID(layout), File: m.ID()}, nil
	}
	if cur == nil { // unregistered: no room holds a mapping to retire
		r.Replace(m, gen)
		s.setVersion(e, l, gen)
		s.announce()
		return Registered{ID: regionID(layout), File: m.ID()}, nil
	}
	failed := s.retireMapping(e, rank, r, func() {
		r.Replace(m, gen)
		s.setVersion(e, l, gen)
	})
	s.log.Info("region replaced", zap.String("region", path), zap.Uint64("generation", gen), zap.Stringer("rank", rankName(rank)),
		zap.String("old_region", cur.ID().Path), zap.Uint64("old_generation", cur.ID().Generation), zap.Int("rooms_failed", failed))
	s.announce()
	return Registered{ID: regionID(layout), File: m.ID(), RoomsFailed: failed}, nil
}

// unregister drops rank's region: the rooms with data-plane state on it
// fail with region_replaced, are fenced, and the mapping is unmapped once
// the fences are done. The other ranks' regions and rooms are untouched.
func (s *regionSlot) unregister(rank *pb.Rank) (Unregistered, error) {
	if err := conn.ValidateRank(rank); err != nil {
		return Unregistered{}, invalid("rank", "%v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	want := transferRank(rank)
	s.vmu.RLock()
	e := s.ranks[want]
	s.vmu.RUnlock()
	if e == nil || e.region == nil || e.region.Current() == nil {
		return Unregistered{}, nil // no region for that rank: nothing to drop
	}
	r := e.region
	gen := r.ID().Generation
	failed := s.retireMapping(e, want, r, func() {
		r.Replace(nil, 0)
		s.vmu.Lock()
		e.proto = nil
		s.vmu.Unlock()
	})
	// The peers keep the layouts they have for it (no room opens on it
	// without a region); the next registration tells them again.
	s.announced = s.layouts()
	s.log.Info("region unregistered", zap.Stringer("rank", rankName(want)), zap.Uint64("generation", gen), zap.Int("rooms_failed", failed))
	return Unregistered{Dropped: true, Generation: gen, RoomsFailed: failed}, nil
}

// retireMapping fails and fences the rooms on rank's current mapping in
// r, runs swap (which replaces it) in the same owner input, and unmaps the
// old mapping once every fence is done: here if they finish within
// retireWait, else on the owner when the last one does. It returns the
// rooms on that mapping failed region_replaced: by this call, or earlier
// once the file was seen replaced (e's failedEarly, taken in the swap's
// input).
func (s *regionSlot) retireMapping(e *rankRegion, rank transfer.Rank, r *transfer.Region, swap func()) int {
	old := r.Current()
	s.countReplaced(e, old.ID().Generation)
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
	failed, earlier := 0, 0
	swapCounted := func() {
		earlier = int(e.failedEarly.Swap(0))
		swap()
	}
	if s.retire != nil {
		failed = s.retire(rank, poll.ReasonRegionReplaced, swapCounted, hold)
	} else {
		swapCounted()
	}
	s.replacedRooms.Add(uint64(failed))
	own()
	select {
	case <-unmapped:
	case <-time.After(retireWait):
		s.log.Warn("retired region still in use by fenced rooms: unmapped when their fences are done", zap.String("region", old.ID().Path))
	}
	return failed + earlier
}

// countReplaced counts rank's generation gen in replacements unless it was
// counted already.
func (s *regionSlot) countReplaced(e *rankRegion, gen uint64) {
	if e.replacedGen.Swap(gen) != gen {
		s.replacements.Add(1)
	}
}

// countedFailure is what counts a room failed with reason by a bind or
// Send that saw rank's file changed, or by decode's same-host stat: for
// region_replaced, the room on the current generation, before the
// register or unregister that retires it (nil for another reason). Run it
// on the owner, in the input that failed the room.
func (s *regionSlot) countedFailure(rank transfer.Rank, reason poll.Reason) func() {
	if reason != poll.ReasonRegionReplaced {
		return nil
	}
	return func() { s.roomReplacedEarly(rank) }
}

// roomReplacedEarly counts a room on rank's current generation failed
// region_replaced before a register or unregister retires it.
func (s *regionSlot) roomReplacedEarly(rank transfer.Rank) {
	s.replacedRooms.Add(1)
	if rank.Size == 0 {
		rank.Size = 1
	}
	s.vmu.RLock()
	e := s.ranks[rank]
	s.vmu.RUnlock()
	if e != nil {
		e.failedEarly.Add(1)
	}
}

// setVersion records rank's registered layout and generation.
func (s *regionSlot) setVersion(e *rankRegion, l *pb.RegionLayout, gen uint64) {
	s.vmu.Lock()
	defer s.vmu.Unlock()
	e.proto, e.gen = l, gen
}

// announce sends REGISTER again when the ranks' layouts are not the ones
// the peers have. Under mu.
func (s *regionSlot) announce() {
	now := s.layouts()
	if len(now) == len(s.announced) {
		same := true
		for i := range now {
			same = same && layoutsEqual(now[i], s.announced[i])
		}
		if same {
			return
		}
	}
	s.announced = now
	if s.onLayout != nil {
		s.onLayout()
	}
}

// checkRank refuses a rank this daemon holds no region for
// (InvalidArgument naming field): a request for it could only fail later,
// on the peer or at a deadline. A nil rank, or tp_size 0, is rank 0 of 1.
func (s *regionSlot) checkRank(field string, r *pb.Rank) error {
	if err := conn.ValidateRank(r); err != nil {
		return invalid(field, "%v", err)
	}
	if s.get() == nil {
		return ErrNoRegion
	}
	rank := transferRank(r)
	if s.rank(rank) == nil {
		return invalid(field, "tp_rank %d of tp_size %d: no region registered for it (this daemon serves %s)", rank.TP, rank.Size, s.served())
	}
	return nil
}

// served names the ranks registered now, for errors.
func (s *regionSlot) served() string {
	s.vmu.RLock()
	defer s.vmu.RUnlock()
	var names []string
	for rank, e := range s.ranks {
		if e.proto != nil {
			names = append(names, regionID(transfer.Layout{Rank: rank}))
		}
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// rank returns rank's region while a file is registered for it (nil
// before its first RegisterRegion and after its UnregisterRegion).
func (s *regionSlot) rank(rank transfer.Rank) *transfer.Region {
	if rank.Size == 0 {
		rank.Size = 1
	}
	s.vmu.RLock()
	e := s.ranks[rank]
	s.vmu.RUnlock()
	if e == nil || e.region == nil || e.region.Current() == nil {
		return nil
	}
	return e.region
}

// get returns the lowest registered rank's region (nil when no rank has
// one): ranks share their shape, so its layout is the daemon's.
func (s *regionSlot) get() *transfer.Region {
	s.vmu.RLock()
	defer s.vmu.RUnlock()
	var best *transfer.Region
	var bestTP uint16
	for rank, e := range s.ranks {
		if e.region != nil && e.region.Current() != nil && (best == nil || rank.TP < bestTP) {
			best, bestTP = e.region, rank.TP
		}
	}
	return best
}

// size is the tp_size of the ranks registered (1 when none is).
func (s *regionSlot) size() uint16 { return max(s.sizeHeld(), 1) }

// stale checks, with one stat, that the file rank's region maps is still
// the one mapped and whole, and names the reason a room about to bind or
// send must fail with instead of moving bytes through it: region_replaced
// for a file deleted or recreated at its path (the engine restarted and
// has not registered again), transfer_error for one truncated under the
// layout (its pages would fault). It logs once per generation.
func (s *regionSlot) stale(rank transfer.Rank, m *transfer.Mapping) (poll.Reason, bool) {
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
	s.vmu.RLock()
	e := s.ranks[rank]
	s.vmu.RUnlock()
	if e != nil && reason == poll.ReasonRegionReplaced {
		s.countReplaced(e, m.ID().Generation)
	}
	if gen := m.ID().Generation; e != nil && e.staleSeen.Swap(gen) != gen {
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

// RegionFaults is how many faults on the regions' memory (a file
// truncated mid-copy) failed rooms instead of the daemon, over every rank.
func (s *regionSlot) RegionFaults() uint64 {
	var n uint64
	for _, r := range s.set().All() {
		n += r.Faults()
	}
	return n
}

// layouts is every registered rank's layout, by rank (what REGISTER
// carries).
func (s *regionSlot) layouts() []*pb.RegionLayout {
	s.vmu.RLock()
	defer s.vmu.RUnlock()
	ranks := make([]transfer.Rank, 0, len(s.ranks))
	for rank, e := range s.ranks {
		if e.proto != nil {
			ranks = append(ranks, rank)
		}
	}
	slices.SortFunc(ranks, func(a, b transfer.Rank) int { return int(a.TP) - int(b.TP) })
	out := make([]*pb.RegionLayout, 0, len(ranks))
	for _, rank := range ranks {
		out = append(out, s.ranks[rank].proto)
	}
	return out
}

// identity is the lowest registered rank's mapping identity (zero when
// none).
func (s *regionSlot) identity() transfer.RegionID {
	if r := s.get(); r != nil {
		return r.ID()
	}
	return transfer.RegionID{}
}

func (s *regionSlot) close() {
	for _, r := range s.set().All() {
		r.Close()
	}
}

// set is every rank's Region, made on first use.
func (s *regionSlot) set() *transfer.Regions {
	s.regionsOnce.Do(func() { s.regions = transfer.NewRegions() })
	return s.regions
}

// keys are the data-plane keys of every rank's share of the room: one per
// rank of the daemon's tp_size (rank 0 of 1 before one is registered). A
// transfer and its fence take their key from here, so a fence finds every
// rank's transfer.
func (s *regionSlot) keys(k poll.Key) []transfer.Key {
	n := s.size()
	out := make([]transfer.Key, n)
	for i := range out {
		out[i] = tkey(k, transfer.Rank{TP: uint16(i), Size: n})
	}
	return out
}

// rankName names a rank in logs.
type rankName transfer.Rank

func (r rankName) String() string { return fmt.Sprintf("%d/%d", r.TP, r.Size) }

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
