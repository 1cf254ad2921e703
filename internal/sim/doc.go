// Package sim is a simulated pair of engine schedulers (prefill and
// decode) that drive real prefilld and decoded over gRPC the way SGLang's
// disaggregation schedulers do: allocate KV pages, open rooms, hand over
// metadata and chunks, poll every tick, verify, clear. pdctl demo and
// bench, the end-to-end tests and the chaos suite use it.
//
// The "engines" are the region files under /dev/shm that the daemons map
// too: prefill pages are filled with a pattern derived from a per-request
// tag (unique even when room ids repeat), the buffer and the page position
// before they are sent, and decode checks every destination byte (and the
// aux row) after Success, so a misplaced, short, stale or foreign page is
// caught. Decode's prefix (Config.PrefixFraction) is told to decoded in
// SendMetadata; the prefill scheduler learns it as SGLang's does, from its
// own room's prefix_len once it is WaitingForInput, and stages and sends
// only the pages after it (Report.SentPages beside LandedPages). Pages of a room that ended Failed are checked to hold no byte
// written after the failure was visible (R7), and pages of a request whose
// decode room never opened to hold none at all.
//
// With Config.PrefillTokensPerS set, the prefill engine models chunked
// prefill on one GPU: each chunk's Send waits (on a timer) for its forward
// pass, and the GPU prefills the requests in flight one at a time, each
// one's chunks back to back (forward.go). Report gives, per successful room, last Send -> decode
// Success and first Send -> decode Success.
//
// Run is one workload on fresh engines. New returns a Sim whose engines
// and connections outlive several workloads (Sim.Run), and whose
// Register re-registers the regions with a daemon that restarted. The
// workload can inject scheduler faults (aborts at every Stage, stalls),
// forget to Clear (NoClear), reuse room ids (Reuse), relay decode's nonce
// to prefill (RelayNonce) and stop early (Stop). A scheduler stops polling
// a side once it saw it end; a daemon that does not answer
// (unreachable:<code>) or no longer knows the room (not_found) ends it too.
//
// # Goroutines
//
// Run starts one goroutine per request in flight (bounded by
// Config.Concurrency; a pair or chain of requests sharing a room id counts
// once); each owns its room on both sides and polls it every tick. The
// page allocators are shared under a mutex. Close stops running workloads
// and waits for them before it unmaps the regions.
package sim
