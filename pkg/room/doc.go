// Package room holds pdlink's room owners: PrefillOwner in prefilld and
// DecodeOwner in decoded. Each owns its daemon's poll.Table and the
// per-room state beside it, and turns scheduler calls, the frames and peer
// events its link (package conn) delivers, and data-plane callbacks into
// events for the table; it performs the table's effects (peer notices,
// fences, forgets) and publishes transitions to Watch. It also owns the
// data plane (package transfer): it builds the transport or sink when the
// engine registers its region, and keeps each room's binding, positions
// and SendMetadata beside the table row. It reaches peers
// only through its link (conn.PrefillLink, conn.DecodeLink), which never
// imports this package (TestConnDoesNotImportTheOwner).
//
// # Files
//
//	owner.go           the owner goroutine: the input queue, exec (a call
//	                   waits for its answer), post (an event nobody waits
//	                   for), deliver (a link's room frame: its ACK is the
//	                   input's last effect), withTable, stop
//	core.go            the effect driver (perform), publication, the tick
//	                   worker, frame events and their ACK (stepFrameOwned,
//	                   answer)
//	fence.go           fences (never waited for), Fenced, parked Abort
//	                   calls, AwaitFailedVisible
//	read.go            Poll, Get, List, Stats, Clear, Shutdown, Watch
//	                   (Subscription)
//	drain.go           Drain: rooms finish, fail at the deadline, stay
//	                   pollable for the terminal grace, then GOODBYE
//	prefill.go,        PrefillOwner: Open, FirstSend, data-plane callbacks;
//	prefill_frames.go  METADATA (binds the room), ABORT, STATUS, ABORT_ACK
//	decode.go,         DecodeOwner: Open (draws the nonce), SendMetadata,
//	decode_rooms.go    data-plane callbacks; ABORT, STATUS; a peer's
//	                   goodbye (peerDeparted)
//	dataplane.go       the data-plane interfaces the owner drives
//	                   (PrefillDataPlane, DecodeDataPlane), Metadata, Rank
//	data_prefill.go    PrefillData over transfer.Transport: bindings,
//	                   positions and the Send path (Send, RegisterRegion);
//	                   a last Send's wait for admission, parked on its room
//	data_decode.go     DecodeData over transfer.Sink: Expect, the receiver's
//	                   callbacks, SubmitMetadata (retries, conflicts)
//	regions.go         the region a daemon serves (one rank today): its
//	                   generations, replacement and UnregisterRegion (fail,
//	                   fence, then unmap) and the per-Send/bind file check
//	reasons.go         transfer reasons -> room reasons
//	convert.go         proto <-> transfer conversions (page lists, layouts,
//	                   ranks, keys): the service does not import transfer
//	errors.go          the owner's sentinels and FieldError/EndedError, for
//	                   the service edge to map to gRPC codes
//
// The script harness (script*_test.go, testdata/script) runs two owners
// over conn.MemNetwork links and compares each scenario's full trace with
// its golden file (-update rewrites them).
//
// # Fences and aborting (I9)
//
// A room that fails is fenced: the node asks its data plane to stop the
// room's worker (Fence) and never waits for it. Fence answers done when
// no worker holds the room; otherwise the data plane calls Fenced(key)
// once the worker let go, from any goroutine. Until then the room is
// Failed inside the table but the scheduler keeps seeing its previous
// state (Poll, Get's Visible, List, Watch, the errors of Send and
// SendMetadata, Clear answering not terminal); at Fenced its Failed is
// published. So a stalled data write delays only its own room's Failed:
// the socket readers, the tick loop (heartbeats, deadlines) and every
// other room go on, and the peer hears the failure at once (its own
// fence covers its side). A Fence that panics is recovered, counted and
// called again on the next tick.
//
// Abort is the one call that waits for a fence: it fails the room, then
// is parked until the room's Failed is visible, so its caller reads
// Failed right after it returns (the gRPC Abort answers Failed, as it
// always did). The wait is bounded by the caller's ctx, never by a
// socket reader: when ctx ends first Abort returns ctx's error, the abort
// stands, and Failed shows once fenced. A second Abort of a room already
// failed returns poll.ErrTerminal at once, whatever is visible; a node
// that stops releases parked calls with ErrClosedNode.
//
// Watch (Subscribe) sees each room's transitions in table order: the owner
// goroutine publishes them as it steps, by a send that never blocks.
//
// # Goroutines and locks
//
// Each owner runs one goroutine that owns its table (owner.go, etcd raft's
// node.run): every input reaches it through one FIFO queue and it steps
// them one at a time, publishing the visible transitions to Watch and
// performing the effects in table order on itself. Scheduler calls (Open,
// FirstSend, SendMetadata, Abort, Clear, Poll, Get, List, Stats) and the
// link's deliveries (frames, whose answer is the ACK the reader sends, and
// peer events) are inputs whose caller waits for the answer: at most for
// the owner's CPU, since the owner never waits (fences answer at once and
// report Fenced later). Data-plane callbacks (OnProgress, OnRankDone,
// OnFailed, Fenced, a stream's Admitted) are inputs nobody waits for, so a transfer goroutine
// that calls back while it holds a lock of its own never waits for an
// owner that may be asking it to fence. Abort waits for its room's Failed
// to be visible on its caller, parked, never on the owner; so does a last
// Send waiting for admission into the peer's in-flight budget (PLAN
// section 5): it is parked on its room in the input that appended its
// pages, and the owner answers it from the stream's admitted event
// (Stream.Admitted, posted), or when the room's Failed is visible or the
// room goes, whatever the data plane does; no caller waits inside the
// data plane (WaitAdmitted).
//
// The data plane's per-room state (PrefillData.rooms/fenced,
// DecodeData.metadata) is touched only in owner inputs and has no lock:
// Bind runs in the input that applies the METADATA, a Send's checks and
// append are one input (execOwned), Fence and Forget are effects.
//
// The owner's other worker is the tick worker (core.go), run under its
// link's supervisor (R6): each tick is one input (poll Tick and fence
// retries), then the link's Tick on the worker itself (retransmits,
// heartbeats, peer liveness; what the link delivers from it becomes inputs
// of their own). Once the node stopped, inputs run on their callers one at
// a time (owner.inline), the table behind the table mutex (withTable), so
// a closed node still answers Poll and Get; it takes no Send. Locks: the table mutex (never contended while the
// owner runs), the link's peer/session and outbox mutexes and the fence
// mutex are never held together; the subscriber mutex is taken only alone
// or inside the table mutex (publication, which never blocks). No
// data-plane or transport call is made under any of them.
//
// # Usage
//
// The daemon (and its gRPC services) must:
//
//  1. Build the node with NewPrefillOwner/NewDecodeOwner (Transport, Logger,
//     poll limits, timings in Config; the data plane's kind and its
//     SenderConfig/ReceiverConfig), then Start it before any other call. On shutdown call Shutdown (bounded by the
//     drain: rooms fail with shutdown, the peers are told until they
//     acknowledge, then hear GOODBYE), then Close (which alone tells them
//     once).
//  2. Map scheduler calls: prefill RegisterRegion/Open/Send/Abort/Clear/
//     Poll/Get/List; decode RegisterRegion/Open (returns the nonce)/
//     SubmitMetadata/Abort/Clear/Poll/Get/List, and ServeData on the data
//     listener; pass Send, SubmitMetadata and Abort the caller's ctx (they
//     may wait). Errors are poll's, package conn's or this package's
//     (errors.go: sentinels, FieldError, EndedError); map them to gRPC
//     codes at the service edge.
//  3. The data plane's callbacks reach the owner by themselves (the owner
//     built it). A test's fake DataPlane must route them: OnProgress,
//     OnFailed, Fenced for a Fence that answered not done, and on decode
//     OnRankDone once a rank's pages and aux row are verified (I8); its
//     Fence must be sticky and must not wait (see PrefillDataPlane).
//  4. Serve Watch from Subscribe (bounded; Dropped counts what a slow
//     reader missed) and metrics from Stats (rooms) and Counters (frames,
//     rejects, retransmits, peers, restarts).
package room
