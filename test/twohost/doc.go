// Package twohost is pdlink's two-host suite (issue 16): prefilld and
// decoded as deployed, on two hosts that talk over a network, not
// loopback. Each test makes its own hosts: two network namespaces joined
// by a veth pair, with the only non-loopback addresses on that pair
// (10.251.16.1/30 prefill, .2 decode), lo up in each, and nothing added
// to the root namespace. It removes them when it ends, failed or not;
// TestMain also removes those of earlier runs whose process died.
//
// On those hosts the daemons run as in production (ip netns exec):
// listeners on the veth addresses at the README's default ports, the
// shared token required (without it neither daemon starts), decoded's
// data listener on the wildcard with --data-advertise naming its veth
// address, and the Debian prometheus binary on the prefill host scraping
// prefilld locally and decoded across the veth. The simulated engines of
// internal/sim stay in the root namespace: the daemons' gRPC unix sockets
// and the region files cross network namespaces, as they cross a
// container boundary beside an engine. The tests read /metrics,
// /debug/rooms and Prometheus' API from inside each host (dialIn), so a
// cut link does not blind them.
//
// Faults: the link cut (ip link set down) and healed, kill -9 of either
// daemon and its restart. Every room live at a fault must end within a
// bound computed from the daemons' configured deadlines, every room of
// the workload within its own bound with its bytes right, and after the
// heal or restart every new room succeeds.
//
// # Usage
//
//	go test ./test/twohost/              # as root; skips, saying why, where namespaces cannot be made
//	PDLINK_TWOHOST_LOGDIR=dir go test ./test/twohost/                 # keep every daemon's log
//
// Product bugs the suite finds are tests that skip with "BUG: ..." until
// they are fixed; PDLINK_TWOHOST_BUGS=1 runs them (none today).
//
// TestMain builds the daemons without the race detector (testbed.BuildDaemons);
// the test process itself may run under -race.
package twohost
