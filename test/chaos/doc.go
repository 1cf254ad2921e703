// Package chaos is pdlink's end-to-end fault-injection suite (issue 7):
// the real prefilld and decoded binaries on loopback, driven by the
// simulated schedulers of internal/sim, under the faults that pin rooms in
// engine-embedded implementations:
//
//   - kill -9 of decoded or prefilld mid-transfer, then a restart on the
//     same ports (kill_test.go);
//   - a fault-injecting TCP proxy (Toxiproxy, embedded) on the control
//     (ZeroMQ) and data (TCP) links between the daemons: delay, dropped
//     connections, resets, a blackhole that heals (proxy_test.go);
//   - stalled schedulers: decode never sends metadata, prefill never sends
//     the last chunk, nobody calls Clear (stall_test.go);
//   - abort storms from both schedulers at every moment of a room's life,
//     from before either side opened to after Success (abort_test.go);
//   - room id reuse: two requests with one id at once, and an id reused
//     right after Clear (reuse_test.go).
//
// Every scenario then checks the same things (checkScenario): every room
// reached a terminal state within its bound; every Success has every
// destination byte right; no byte landed in a failed room's pages after
// Failed was visible (R7); after the schedulers cleared, both daemons'
// tables are empty (pdlink_rooms and /debug/rooms); the daemons'
// goroutines are back to their baseline. The stall scenarios also check
// that the metrics showed the stuck rooms (pdlink_rooms_overdue,
// pdlink_room_oldest_age_seconds) before their deadline failed them.
//
// # Usage
//
//	go test ./test/chaos/                       # short: tens to a couple hundred rooms per scenario
//	PDLINK_CHAOS_LONG=1 go test -timeout 30m ./test/chaos/   # long: more rooms, longer faults, more seeds
//
// Each test logs one summary line (go test -v shows them) and TestMain
// prints the table of every scenario that ran (go test shows it with -v or
// on failure). PDLINK_CHAOS_SEED fixes the workload seed;
// PDLINK_CHAOS_LOGDIR=dir keeps every daemon's full log there.
//
// Product bugs the suite found are tests that skip with "BUG: ..." until
// they are fixed; PDLINK_CHAOS_BUGS=1 runs them (they fail). The scenarios
// tolerate those bugs' symptoms only where the bug explains them.
//
// TestMain builds the binaries once, without the race detector: under
// -race the daemons run about 15 times slower and every deadline of the
// suite would have to grow with them. The test process itself (the
// simulated schedulers, the proxies) may run under -race.
package chaos
