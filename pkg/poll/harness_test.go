package poll

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// Test timings: short and distinct so a trace shows which deadline fired.
const (
	bootT     = 10 * time.Second
	waitT     = 20 * time.Second
	idleT     = 5 * time.Second
	lingerT   = 60 * time.Second
	tombTTL   = 30 * time.Second
	maxTombs  = 16
	testPeer  = PeerID(7)
	otherPeer = PeerID(8)
)

func testConfig(side Side) Config {
	return Config{
		Side:                side,
		BootstrapTimeout:    bootT,
		WaitingTimeout:      waitT,
		TransferIdleTimeout: idleT,
		ClearLinger:         lingerT,
		MaxRooms:            1000,
		TombstoneTTL:        tombTTL,
		MaxTombstones:       maxTombs,
		OverdueFraction:     0.5,
		HistoryLen:          HistoryCap,
	}
}

func at(d time.Duration) int64 { return int64(d) }

// harness wraps a table with a clock and a record of effects, so scenario
// tests read like scripts.
type harness struct {
	t       testing.TB
	tab     *Table
	now     int64
	effects []Effect
}

func newHarness(t testing.TB, side Side) *harness {
	t.Helper()
	tab, err := New(testConfig(side))
	if err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, tab: tab}
}

// step applies ev at the current time and records the effects.
func (h *harness) step(ev Event) error {
	err := h.tab.Step(h.now, ev)
	h.collect()
	return err
}

// must steps ev and fails the test on error.
func (h *harness) must(ev Event) {
	h.t.Helper()
	if err := h.step(ev); err != nil {
		h.t.Fatalf("step %v %v: %v", ev.Kind, ev.Key, err)
	}
}

// expectErr steps ev and checks the sentinel error.
func (h *harness) expectErr(ev Event, want error) {
	h.t.Helper()
	if err := h.step(ev); !errors.Is(err, want) {
		h.t.Fatalf("step %v %v: got %v, want %v", ev.Kind, ev.Key, err, want)
	}
}

func (h *harness) advance(d time.Duration) {
	h.now += int64(d)
	h.tab.Tick(h.now)
	h.collect()
}

func (h *harness) collect() {
	h.effects = append(h.effects, h.tab.Ready()...)
	h.tab.Advance()
	if err := h.tab.CheckInvariants(); err != nil {
		h.t.Fatalf("invariants: %v", err)
	}
}

// take returns and forgets the effects recorded so far.
func (h *harness) take() []Effect {
	e := h.effects
	h.effects = nil
	return e
}

// has reports whether an effect of kind k for room id matching pred was
// recorded (without forgetting it).
func (h *harness) has(k EffectKind, room RoomID, pred func(Effect) bool) bool {
	for _, e := range h.effects {
		if e.Kind == k && e.Key.Room == room && (pred == nil || pred(e)) {
			return true
		}
	}
	return false
}

func (h *harness) state(id RoomID) State {
	h.t.Helper()
	info, err := h.tab.Get(id)
	if err != nil {
		return StateNone
	}
	return info.State
}

func (h *harness) visible(id RoomID) State {
	return h.tab.Poll([]RoomID{id}, nil)[0]
}

func (h *harness) expectState(id RoomID, want State) {
	h.t.Helper()
	if got := h.state(id); got != want {
		h.t.Fatalf("room %d: state %v, want %v", id, got, want)
	}
}

func (h *harness) reason(id RoomID) Reason {
	info, _ := h.tab.Get(id)
	return info.Reason
}

// Event constructors.
func open(room RoomID, nonce Nonce, peer PeerID) Event {
	return Event{Kind: EvOpen, Key: Key{room, nonce}, Peer: peer}
}
func ev(kind EventKind, room RoomID, nonce Nonce, peer PeerID) Event {
	return Event{Kind: kind, Key: Key{room, nonce}, Peer: peer}
}
func local(kind EventKind, room RoomID) Event { return Event{Kind: kind, Key: Key{Room: room}} }

// formatEffects renders effects one per line for traces and failures.
func formatEffects(es []Effect) string {
	var b strings.Builder
	for _, e := range es {
		fmt.Fprintf(&b, "%s\n", formatEffect(e))
	}
	return b.String()
}

func formatEffect(e Effect) string {
	s := fmt.Sprintf("%s %s", e.Kind, e.Key)
	switch e.Kind {
	case EffTransition:
		s += fmt.Sprintf(" %v->%v", e.From, e.To)
		if !e.Visible {
			s += " (hidden)"
		}
	case EffNotifyPeer:
		s += fmt.Sprintf(" peer=%d %v", e.Peer, e.Status)
	case EffReplyUnknown:
		s += fmt.Sprintf(" peer=%d %v", e.Peer, e.Reply)
		if e.Reply == ReplyEnded {
			s += fmt.Sprintf(" %v", e.Status)
		}
	case EffReaped, EffRemoved:
		s += fmt.Sprintf(" %v", e.Status)
	}
	if e.Reason != ReasonNone {
		s += " reason=" + string(e.Reason)
	}
	return s
}
