package poll

import (
	"errors"
	"flag"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// modelRoom is what the test believes about one room, built only from the
// effects the table emitted.
type modelRoom struct {
	key    Key
	state  State
	fenced bool
}

// abortRecord is an abort the test saw land on a room id with no room.
type abortRecord struct {
	key Key
	at  int64
}

// machine drives a table with random events and times and checks I1-I7
// after every action.
type machine struct {
	tab    *Table
	cfg    Config
	now    int64
	model  map[RoomID]*modelRoom
	aborts []abortRecord
	reaped uint64
}

var (
	rapidRooms  = []RoomID{1, 2, 3}
	rapidNonces = []Nonce{10, 11} // rooms share ids with different nonces
	rapidPeers  = []PeerID{NoPeer, 7, 8}
	rapidReason = []Reason{ReasonNone, ReasonChecksum, ReasonTransferError, ReasonTimeoutTransferring}
)

// reachedStates counts, over all runs, the transitions into each state, so
// the test can show it explored the whole machine.
var (
	reachedStates [numStates]int
	actionsRun    int
	reboundRooms  int
	failReasons   = map[Reason]uint64{}
)

func TestStateMachineInvariants(t *testing.T) {
	// rapid averages 30 actions per run by default; rooms need more to
	// reach every state and deadline. -rapid.steps on the command line wins.
	if f := flag.Lookup("rapid.steps"); f != nil && f.Value.String() == f.DefValue {
		_ = f.Value.Set("300")
		defer func() { _ = f.Value.Set(f.DefValue) }()
	}
	reachedStates, actionsRun, reboundRooms = [numStates]int{}, 0, 0
	defer func() {
		t.Logf("%d actions; transitions into each state: %v; failures %v; %d rooms rebound", actionsRun, reachedStates, failReasons, reboundRooms)
		if reboundRooms == 0 && !t.Failed() {
			t.Error("no run moved a room to a restarted peer's new instance")
		}
		for _, s := range AllStates() {
			if reachedStates[s] == 0 && !t.Failed() {
				t.Errorf("no run reached %v", s)
			}
		}
	}()
	rapid.Check(t, func(rt *rapid.T) {
		side := rapid.SampledFrom([]Side{Prefill, Decode}).Draw(rt, "side")
		cfg := testConfig(side)
		cfg.MaxTombstones = 256 // no eviction: the I4 model relies on it
		cfg.BootstrapTimeout, cfg.WaitingTimeout, cfg.TransferIdleTimeout = 30*time.Second, 30*time.Second, 20*time.Second
		tab, err := New(cfg)
		if err != nil {
			rt.Fatal(err)
		}
		m := &machine{tab: tab, cfg: cfg, model: map[RoomID]*modelRoom{}}
		rt.Repeat(map[string]func(*rapid.T){
			"open":        m.open,
			"metadata":    func(rt *rapid.T) { m.frame(rt, EvMetadata) },
			"peerStatus":  m.sometimes(func(rt *rapid.T) { m.frame(rt, EvPeerStatus) }),
			"abortRemote": m.sometimes(func(rt *rapid.T) { m.frame(rt, EvAbortRemote) }),
			"forward":     m.forward,
			"forward2":    m.forward,
			"firstChunk":  func(rt *rapid.T) { m.local(rt, EvFirstChunk) },
			"progress":    func(rt *rapid.T) { m.local(rt, EvProgress) },
			"done":        func(rt *rapid.T) { m.local(rt, EvDone) },
			"abortLocal":  m.sometimes(func(rt *rapid.T) { m.local(rt, EvAbortLocal) }),
			"fenced":      func(rt *rapid.T) { m.local(rt, EvFenced) },
			"clear":       func(rt *rapid.T) { m.local(rt, EvClear) },
			"peerLost": m.sometimes(func(rt *rapid.T) {
				m.step(rt, Event{Kind: rapid.SampledFrom([]EventKind{EvPeerLost, EvPeerRestarted}).Draw(rt, "kind"),
					Peer: rapid.SampledFrom(rapidPeers[1:]).Draw(rt, "peer")})
			}),
			"peerReplaced": m.sometimes(func(rt *rapid.T) {
				// Refused on prefill; on decode old and new swap roles
				// from run to run, so rooms move back and forth.
				old := rapid.SampledFrom(rapidPeers[1:]).Draw(rt, "old")
				m.step(rt, Event{Kind: EvPeerReplaced, Peer: old, NewPeer: 7 + 8 - old})
			}),
			"shutdown": func(rt *rapid.T) {
				if rapid.IntRange(0, 49).Draw(rt, "rare") == 0 {
					m.step(rt, Event{Kind: EvShutdown})
				}
			},
			"advance": func(rt *rapid.T) {
				d := time.Duration(rapid.IntRange(0, 4000).Draw(rt, "millis")) * time.Millisecond
				if rapid.IntRange(0, 7).Draw(rt, "long") == 0 {
					d = time.Duration(rapid.IntRange(0, 70).Draw(rt, "seconds")) * time.Second
				}
				m.now += int64(d)
				m.tab.Tick(m.now)
				m.absorb(rt, evNone, nil)
			},
			"": m.check,
		})
	})
}

// sometimes runs a failure action one time in four, so rooms live long
// enough to reach every state.
func (m *machine) sometimes(f func(*rapid.T)) func(*rapid.T) {
	return func(rt *rapid.T) {
		if rapid.IntRange(0, 3).Draw(rt, "sometimes") == 0 {
			f(rt)
		}
	}
}

// forward steps the natural next event of a room: the happy path.
func (m *machine) forward(rt *rapid.T) {
	k, p := m.aim(rt)
	info, err := m.tab.Get(k.Room)
	if err != nil {
		return
	}
	switch info.State {
	case Bootstrapping:
		m.stepMaybeAbort(rt, Event{Kind: EvMetadata, Key: k, Peer: p})
	case WaitingForInput:
		m.stepMaybeAbort(rt, Event{Kind: EvFirstChunk, Key: Key{Room: k.Room}})
	case Transferring:
		if rapid.Bool().Draw(rt, "progress") {
			m.stepMaybeAbort(rt, Event{Kind: EvProgress, Key: Key{Room: k.Room}})
		} else {
			rank := uint8(rapid.IntRange(0, info.Ranks-1).Draw(rt, "rank"))
			for i := 0; i < info.Ranks && rapid.IntRange(0, 3).Draw(rt, "missing") > 0; i++ {
				if info.RanksDone&(1<<i) == 0 {
					rank = uint8(i) // a rank not done yet
					break
				}
			}
			m.stepMaybeAbort(rt, Event{Kind: EvDone, Key: Key{Room: k.Room}, Rank: rank})
		}
	case Failed:
		m.stepMaybeAbort(rt, Event{Kind: EvFenced, Key: Key{Room: k.Room}})
	case Success:
		m.stepMaybeAbort(rt, Event{Kind: EvClear, Key: Key{Room: k.Room}})
	}
}

func (m *machine) open(rt *rapid.T) {
	k := Key{rapid.SampledFrom(rapidRooms).Draw(rt, "room"), rapid.SampledFrom(rapidNonces).Draw(rt, "nonce")}
	if m.cfg.Side == Prefill && rapid.Bool().Draw(rt, "unbound") {
		k.Nonce = 0
	}
	ev := Event{Kind: EvOpen, Key: k, Peer: rapid.SampledFrom(rapidPeers).Draw(rt, "peer"),
		Ranks: uint8(rapid.IntRange(0, 3).Draw(rt, "ranks"))}
	wantAbort := m.compatibleAborts(k)
	existed := m.model[k.Room] != nil
	err := m.step(rt, ev)
	if existed {
		if !errors.Is(err, ErrAlreadyExists) && !errors.Is(err, ErrCollision) {
			rt.Fatalf("open over an existing room: %v", err)
		}
		return
	}
	if err != nil {
		rt.Fatalf("open: %v", err)
	}
	got := m.model[k.Room].state
	// I4: an abort that came first makes the open fail at once.
	if wantAbort {
		if got != Failed {
			rt.Fatalf("I4: open of %v after an abort is %v", k, got)
		}
		kept := m.aborts[:0]
		for _, a := range m.aborts {
			if a.key.Room != k.Room || !nonceCompatible(a.key.Nonce, k.Nonce) {
				kept = append(kept, a)
			}
		}
		m.aborts = kept
	} else if got != Bootstrapping {
		rt.Fatalf("open of %v without abort is %v", k, got)
	}
}

// compatibleAborts reports whether an unexpired abort record matches an
// open of k.
func (m *machine) compatibleAborts(k Key) bool {
	for _, a := range m.aborts {
		if a.key.Room == k.Room && nonceCompatible(a.key.Nonce, k.Nonce) && a.at+int64(m.cfg.TombstoneTTL) > m.now {
			return true
		}
	}
	return false
}

// aim returns, most of the time, the key and peer of the room in the table
// (so events mostly land), otherwise random ones (so mismatches happen).
func (m *machine) aim(rt *rapid.T) (Key, PeerID) {
	k := Key{rapid.SampledFrom(rapidRooms).Draw(rt, "room"), rapid.SampledFrom(rapidNonces).Draw(rt, "nonce")}
	p := rapid.SampledFrom(rapidPeers[1:]).Draw(rt, "peer")
	if info, err := m.tab.Get(k.Room); err == nil && rapid.IntRange(0, 3).Draw(rt, "aim") > 0 {
		if info.Key.Nonce != 0 {
			k.Nonce = info.Key.Nonce
		}
		if info.Peer != NoPeer {
			p = info.Peer
		}
	}
	return k, p
}

func (m *machine) frame(rt *rapid.T, kind EventKind) {
	k, p := m.aim(rt)
	ev := Event{Kind: kind, Key: k, Peer: p}
	if kind != EvMetadata {
		ev.Reason = rapid.SampledFrom(rapidReason).Draw(rt, "reason")
	}
	if kind == EvMetadata {
		ev.Ranks = uint8(rapid.IntRange(0, 3).Draw(rt, "ranks"))
	}
	m.stepMaybeAbort(rt, ev)
}

func (m *machine) local(rt *rapid.T, kind EventKind) {
	k, _ := m.aim(rt)
	ev := Event{Kind: kind, Key: Key{Room: k.Room}}
	if rapid.IntRange(0, 3).Draw(rt, "withNonce") == 0 {
		ev.Key.Nonce = k.Nonce
	}
	if kind == EvDone {
		ev.Rank = uint8(rapid.IntRange(0, 3).Draw(rt, "rank"))
	}
	if kind == EvAbortLocal {
		ev.Reason = rapid.SampledFrom(rapidReason).Draw(rt, "reason")
	}
	m.stepMaybeAbort(rt, ev)
}

// stepMaybeAbort steps ev and records abort tombstones the table must
// have created (I4).
func (m *machine) stepMaybeAbort(rt *rapid.T, ev Event) {
	absent := m.model[ev.Key.Room] == nil
	err := m.step(rt, ev)
	if absent && isFailKind(ev.Kind) && err == nil {
		kept := m.aborts[:0]
		for _, a := range m.aborts {
			if a.key == ev.Key && a.at+int64(m.cfg.TombstoneTTL) > m.now {
				return // the first abort is kept
			}
			if a.key.Room != ev.Key.Room { // one abort tombstone per room id
				kept = append(kept, a)
			}
		}
		m.aborts = append(kept, abortRecord{key: ev.Key, at: m.now})
	}
}

// step applies ev and folds the effects into the model.
func (m *machine) step(rt *rapid.T, ev Event) error {
	before := m.snapshot()
	err := m.tab.Step(m.now, ev)
	m.absorb(rt, ev.Kind, err)
	if err != nil {
		// A rejected event changes nothing (time did not move, so nothing
		// expired either).
		if after := m.snapshot(); after != before {
			rt.Fatalf("rejected %v (%v) changed the table:\n%v\n%v", ev.Kind, err, before, after)
		}
	}
	return err
}

type snap [4][3]uint8 // per room id: exists, state, visible

func (m *machine) snapshot() (s snap) {
	for i, id := range rapidRooms {
		if info, err := m.tab.Get(id); err == nil {
			s[i] = [3]uint8{1, uint8(info.State), uint8(info.Visible)}
		}
	}
	return s
}

// absorb checks every effect against the model (I1, I2, I3) and applies it.
func (m *machine) absorb(rt *rapid.T, kind EventKind, err error) {
	for _, e := range m.tab.Ready() {
		mr := m.model[e.Key.Room]
		switch e.Kind {
		case EffTransition:
			if err != nil {
				rt.Fatalf("rejected event emitted a transition %v", formatEffect(e))
			}
			if e.From == StateNone {
				if kind != EvOpen || mr != nil { // I3
					rt.Fatalf("I3: room created by %v: %v", kind, formatEffect(e))
				}
				mr = &modelRoom{key: e.Key, fenced: e.To == Failed}
				m.model[e.Key.Room] = mr
			} else {
				if mr == nil || mr.state != e.From {
					rt.Fatalf("transition from %v but model has %+v", e.From, mr)
				}
				if mr.state.Terminal() { // I1
					rt.Fatalf("I1: terminal room moved: %v", formatEffect(e))
				}
				cause := kind
				if kind == evNone || kind == EvProgress || kind == EvFirstChunk && e.To == Failed {
					cause = EvTimeout
				}
				if to, ok := Legal(e.From, cause); !ok || to != e.To { // I2
					rt.Fatalf("I2: %v --%v--> %v is not in the move table", e.From, cause, e.To)
				}
			}
			mr.state, mr.key = e.To, e.Key
			reachedStates[e.To]++
		case EffRebound:
			// Only a room the restarted peer never held moves, unchanged,
			// to the new instance (issue 12); it is never created (I3).
			if kind != EvPeerReplaced || err != nil || mr == nil || mr.state != Bootstrapping || e.Status != Bootstrapping {
				rt.Fatalf("rebound by %v (%v) of %+v: %v", kind, err, mr, formatEffect(e))
			}
			if r := m.tab.rooms[e.Key.Room]; r == nil || r.peer != e.Peer {
				rt.Fatalf("rebound to %d but the table says %+v", e.Peer, r)
			}
			reboundRooms++
		case EffPublish:
			if mr == nil || mr.state != Failed || mr.fenced {
				rt.Fatalf("publish of %+v", mr)
			}
			mr.fenced = true
		case EffFence:
			failReasons[m.tab.rooms[e.Key.Room].reason.reason()]++
		case EffRemoved, EffReaped:
			if mr == nil || !mr.state.Terminal() {
				rt.Fatalf("removal of a live room %+v", mr)
			}
			if e.Kind == EffReaped {
				m.reaped++
			}
			delete(m.model, e.Key.Room)
		}
	}
	m.tab.Advance()
}

func (m *machine) check(rt *rapid.T) {
	actionsRun++
	if e := m.tab.Ready(); len(e) > 0 {
		rt.Fatalf("effects left undrained: %v", e)
	}
	if err := m.tab.CheckInvariants(); err != nil { // I6 (and I5/I7 inside)
		rt.Fatal(err)
	}
	s := m.tab.Stats(m.now)
	if s.Rooms != len(m.model) || s.ReapedUncleared != m.reaped {
		rt.Fatalf("stats rooms %d reaped %d, model %d %d", s.Rooms, s.ReapedUncleared, len(m.model), m.reaped)
	}
	for _, id := range rapidRooms {
		mr := m.model[id]
		info, err := m.tab.Get(id)
		if mr == nil {
			if err == nil {
				rt.Fatalf("room %d in the table, not in the model", id)
			}
			continue
		}
		if err != nil || info.State != mr.state || info.Key != mr.key {
			rt.Fatalf("room %d: table %v %v, model %+v", id, info.Key, info.State, mr)
		}
		// I9: Failed is visible only once fenced.
		if info.Visible == Failed && !mr.fenced || info.State != Failed && info.Visible != info.State {
			rt.Fatalf("I9: room %d visible %v state %v fenced %v", id, info.Visible, info.State, mr.fenced)
		}
		// I5 / I7, independently of the queue: no room older than its
		// state's deadline (Transferring: since its last progress).
		age := time.Duration(m.now - info.StateEnteredAt)
		if info.State != Transferring && age >= m.cfg.deadline(info.State) {
			rt.Fatalf("I5/I7: room %d %v for %v", id, info.State, age)
		}
		if info.Deadline <= m.now {
			rt.Fatalf("I5: room %d past its deadline", id)
		}
	}
	// I4: every recorded abort is either consumed, expired, or still there.
	live := 0
	for _, a := range m.aborts {
		if a.at+int64(m.cfg.TombstoneTTL) > m.now {
			live++
		}
	}
	if got := countAborts(m.tab); got != live {
		rt.Fatalf("I4: %d abort tombstones, model %d", got, live)
	}
}

func countAborts(t *Table) int {
	n := 0
	for _, head := range t.tombs {
		for tb := head; tb != nil; tb = tb.next {
			if tb.kind == tombAbort {
				n++
			}
		}
	}
	return n
}
