package metrics

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pdlink/pdlink/pkg/poll"
)

// pdlink_rooms_overdue{state} counts the rooms that spent at least OverdueFraction of their
// state's deadline in it, as of the driver's last tick (the table's clock is the injected
// one: every time below is the tick the test drives). The boundary is inclusive, the count
// is per state, and a room that moves on starts the new state's clock.
func TestRoomsOverdueCountsRoomsPastTheFractionOfTheirDeadline(t *testing.T) {
	cfg := poll.DefaultConfig(poll.Decode)
	cfg.BootstrapTimeout, cfg.WaitingTimeout, cfg.OverdueFraction = 10*time.Second, 20*time.Second, 0.5
	tbl, err := poll.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := int64(0)
	reg := prometheus.NewRegistry()
	if err := Register(reg, NewCollector(SideDecode, Sources{Rooms: func() poll.Stats { return tbl.Stats(now) }}), NewRecorder(SideDecode)); err != nil {
		t.Fatal(err)
	}
	at := func(d time.Duration) { now = int64(d); tbl.Tick(now); tbl.Advance() }
	step := func(ev poll.Event) {
		t.Helper()
		if err := tbl.Step(now, ev); err != nil {
			t.Fatal(err)
		}
		tbl.Advance()
	}
	key := func(i int) poll.Key { return poll.Key{Room: poll.RoomID(i), Nonce: poll.Nonce(i)} }
	overdue := func(st string) float64 {
		t.Helper()
		return value(t, gather(t, reg), "pdlink_rooms_overdue", map[string]string{"side": SideDecode, "state": st})
	}
	expect := func(when string, boot, waiting float64) {
		t.Helper()
		if b, w := overdue("Bootstrapping"), overdue("WaitingForInput"); b != boot || w != waiting {
			t.Errorf("%s: overdue Bootstrapping %v, WaitingForInput %v; want %v, %v", when, b, w, boot, waiting)
		}
	}

	for i := range 3 { // rooms 1, 2, 3 open at 0s, 1s, 2s; Bootstrapping is overdue after 5s
		at(time.Duration(i) * time.Second)
		step(poll.Event{Kind: poll.EvOpen, Key: key(i + 1), Peer: 1})
	}
	at(5*time.Second - 1)
	expect("just before room 1's half deadline", 0, 0)
	at(5 * time.Second)
	expect("at room 1's half deadline", 1, 0)
	at(6 * time.Second)
	expect("at room 2's half deadline", 2, 0)

	// Room 1 gets its metadata: it leaves the Bootstrapping count and WaitingForInput's
	// clock (overdue after 10s) starts now.
	step(poll.Event{Kind: poll.EvMetadata, Key: key(1), Peer: 1})
	expect("room 1 moved on", 1, 0)
	at(16*time.Second - 1)
	expect("rooms 2 and 3 timed out, room 1 just before its half deadline", 0, 0)
	at(16 * time.Second)
	expect("room 1 at its half deadline", 0, 1)
	if v := overdue("Failed"); v != 0 {
		t.Errorf("overdue Failed %v: the timed-out rooms just entered Failed", v)
	}
}
