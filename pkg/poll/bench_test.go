package poll

import (
	"runtime"
	"sync"
	"testing"
	"time"
)

func benchTable(b *testing.B, maxRooms int) *Table {
	b.Helper()
	cfg := DefaultConfig(Decode)
	cfg.MaxRooms = maxRooms
	tab, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	return tab
}

// lifecycle is one room's happy path on decode: 4 transitions, 2 progress
// refreshes and a clear (7 events).
var lifecycle = [...]EventKind{EvOpen, EvMetadata, EvFirstChunk, EvProgress, EvProgress, EvDone, EvClear}

// BenchmarkStep drives 1024 rooms through their lifecycle round-robin, the
// way a busy daemon interleaves them, and drains effects after every Step
// as a driver would. It reports transitions (state changes, opens
// included) per second.
func BenchmarkStep(b *testing.B) {
	const rooms = 1024
	tab := benchTable(b, 1<<20)
	var pos [rooms]uint8
	var gen [rooms]Nonce
	transitions := 0
	now := int64(0)
	b.ReportAllocs()
	start := time.Now()
	for i := 0; b.Loop(); i++ {
		r := i & (rooms - 1)
		if pos[r] == 0 {
			gen[r]++
		}
		ev := Event{Kind: lifecycle[pos[r]], Key: Key{RoomID(r), gen[r]}, Peer: testPeer}
		now += 100
		if err := tab.Step(now, ev); err != nil {
			b.Fatalf("%v: %v", ev.Kind, err)
		}
		for _, e := range tab.Ready() {
			if e.Kind == EffTransition {
				transitions++
			}
		}
		tab.Advance()
		pos[r] = uint8((int(pos[r]) + 1) % len(lifecycle))
	}
	elapsed := time.Since(start).Seconds()
	b.ReportMetric(float64(transitions)/elapsed, "transitions/s")
	b.ReportMetric(float64(b.N)/elapsed, "events/s")
}

// BenchmarkStepMutex is BenchmarkStep behind the recommended owner (one
// mutex), from all cores at once: the cost of the single-owner choice.
func BenchmarkStepMutex(b *testing.B) {
	tab := benchTable(b, 1<<20)
	var mu sync.Mutex
	var next RoomID
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		mu.Lock()
		base := next
		next += 1 << 20
		mu.Unlock()
		i, n := 0, RoomID(0)
		for pb.Next() {
			kind := lifecycle[i%len(lifecycle)]
			if kind == EvOpen {
				n++
			}
			mu.Lock()
			now := tab.Now() + 100
			_ = tab.Step(now, Event{Kind: kind, Key: Key{base + n, 1}, Peer: testPeer})
			tab.Advance()
			mu.Unlock()
			i++
		}
	})
}

// pollBenchTable is a table holding 100k open rooms, and 1000 of their
// ids spread over it, for the Poll benchmarks.
func pollBenchTable(b *testing.B) (*Table, []RoomID) {
	b.Helper()
	const live = 100_000
	tab := benchTable(b, live)
	for i := 0; i < live; i++ {
		if err := tab.Step(0, open(RoomID(i), Nonce(i+1), testPeer)); err != nil {
			b.Fatal(err)
		}
		tab.Advance()
	}
	ids := make([]RoomID, 1000)
	for i := range ids {
		ids[i] = RoomID((i * 97) % live)
	}
	return tab, ids
}

// BenchmarkPoll1000 polls 1000 rooms of a table holding 100k.
func BenchmarkPoll1000(b *testing.B) {
	tab, ids := pollBenchTable(b)
	out := make([]State, 0, len(ids))
	b.ReportAllocs()
	for b.Loop() {
		out = tab.Poll(ids, out)
	}
	if out[0] != Bootstrapping {
		b.Fatal(out[0])
	}
}

// BenchmarkMemoryPerRoom100k measures the heap held per live room (room,
// history ring, map slot, inflight and peer links) at 100k rooms.
func BenchmarkMemoryPerRoom100k(b *testing.B) {
	const live = 100_000
	var perRoom float64
	for b.Loop() {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		tab := benchTable(b, live)
		for i := 0; i < live; i++ {
			k := Key{RoomID(i), Nonce(i + 1)}
			_ = tab.Step(0, Event{Kind: EvOpen, Key: k, Peer: PeerID(1 + i%16)})
			_ = tab.Step(0, Event{Kind: EvMetadata, Key: k, Peer: PeerID(1 + i%16)})
			_ = tab.Step(0, Event{Kind: EvFirstChunk, Key: Key{Room: k.Room}})
			tab.Advance()
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		perRoom = float64(after.HeapAlloc-before.HeapAlloc) / live
		runtime.KeepAlive(tab)
	}
	b.ReportMetric(perRoom, "bytes/room")
}

// BenchmarkPollStatus1000 is BenchmarkPoll1000 with nonces and reasons, as
// the scheduler's Poll answers it.
func BenchmarkPollStatus1000(b *testing.B) {
	tab, ids := pollBenchTable(b)
	out := make([]Status, 0, len(ids))
	b.ReportAllocs()
	for b.Loop() {
		out = tab.PollStatus(ids, out)
	}
	if out[0].State != Bootstrapping || out[0].Nonce == 0 {
		b.Fatal(out[0])
	}
}
