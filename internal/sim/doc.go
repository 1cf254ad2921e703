// Package sim is a simulated pair of engine schedulers (prefill and
// decode) that drive real prefilld and decoded over gRPC the way SGLang's
// disaggregation schedulers do: allocate KV pages, open rooms, hand over
// metadata and chunks, poll every tick, verify, clear. pdctl demo and the
// end-to-end tests use it.
//
// The "engines" are the region files under /dev/shm that the daemons map
// too: prefill pages are filled with a pattern derived from (room, buffer,
// page position) before they are sent, and decode checks every destination
// byte (and the aux row) after Success, so a misplaced, short or stale page
// is caught. Pages of a room that ended Failed are checked to hold no byte
// written after the failure was visible (R7).
//
// # Goroutines
//
// Run starts one goroutine per request in flight (bounded by
// Config.Concurrency); each owns its room on both sides and polls it every
// tick. The page allocators are shared under a mutex.
package sim
