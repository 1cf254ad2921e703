// Package testbed is the machinery the real-process suites (test/chaos,
// test/twohost) share: the daemons' short deadlines and the bounds they
// imply, a prefilld or decoded child that can be killed -9 and restarted
// on the same addresses, reading its /metrics and /debug/rooms, and the
// checks every scenario ends with (no room pinned or past its bound, every
// byte right, only the allowed outcomes, empty room tables, no goroutine
// leak).
//
// It knows nothing of where a daemon runs: a suite passes the command
// that starts it (the binary itself on loopback, or ip netns exec in a
// namespace) and the HTTP client that reaches its /metrics from there.
// The suites' own scenarios, topologies and fault injection stay in the
// suites.
//
// # Usage
//
//  1. TestMain builds the daemons once with BuildDaemons (no race
//     detector: the deadlines are seconds).
//  2. Start each daemon; Pin every port 0 listener to the address it
//     bound, so Restart comes back on it.
//  3. Baseline the goroutines after a warm-up, run workloads, and end
//     each scenario with CheckReport and Leaks.
//
// # Goroutines
//
// testbed starts none of its own. Each Daemon's proc.Process owns two
// (the stderr scanner and the waiter), which end when the child exits;
// Start registers a cleanup that kills the child, so they end with the
// test. Eventually polls on the caller's goroutine.
package testbed
