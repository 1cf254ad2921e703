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
//	regions.go         the regions a daemon serves, one per TP rank (one
//	                   tp_size): each rank's generations, replacement and
//	                   UnregisterRegion (fail, fence, then unmap) and the
//	                   per-Send/bind file check
//	ranks_open.go      one room per request shared by every rank: the
//	                   first Open creates it, sibling ranks join
//	rankfence.go       a room's fence over its ranks' data-plane keys
//	prefix.go          decode's prefix of each prefill room (the fewest
//	                   positions any decode rank holds), for the room's
//	                   status: recorded before the binding METADATA is
//	                   stepped, so its transition carries it; dropped with
//	                   the room
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
// # Tensor-parallel ranks (issue 15)
//
// One daemon serves every TP rank of its engine. Each rank registers its
// own region file (RegisterRegion with layout.rank); all ranks of a daemon
// share one tp_size (another is refused naming layout.rank until every
// rank is unregistered). The data plane is one transfer Sender or Receiver
// per daemon over a transfer.Regions: connections and the in-flight budget
// stay per peer, and each stream or expectation resolves its region by its
// key's rank (a stream reads its Source rank's, the receiver writes its
// key's rank's); a rank with no region is refused invalid, never touched.
// REGISTER carries every rank's layout and goes again when one changes.
//
// A request is one room per daemon, shared by its ranks, so Poll, Watch and
// Get are per room and every rank's scheduler sees the same state (SGLang's
// MIN all-reduce over ranks). Each rank's scheduler opens the room with its
// rank: the first Open creates it, a sibling rank of the same tp_size joins
// (decode answers the same nonce, and checks the prefill address and
// expected_senders against the first Open's), the same rank again is
// AlreadyExists. The rank mapping comes from transfer.PlanRanks over
// pkg/rankmap, per decode peer (peerplan.go), never recomputed here:
//
//   - decode rank d's SendMetadata is one METADATA naming d; prefill binds
//     the prefill ranks in Mapping.DecodeRanks[d].From to it. The prefill
//     room stays Bootstrapping until every decode rank's METADATA arrived
//     (poll's EvMetadata Addressed: decode tp_size frames, by rank), so a
//     rank's Send always finds its destination; decode retries each rank's
//     METADATA until that rank's is applied.
//   - each prefill rank Sends its own pages (SendRequest.rank): one stream
//     per decode rank it feeds (Mapping.PrefillRanks[s].To; MLA with decode
//     TP larger: several, each the whole latent), keyed by that decode rank.
//     A dummy rank (MLA with prefill TP larger: addressed, feeding nobody)
//     has its Sends taken and moves nothing, as SGLang's is_dummy.
//   - decode expects each rank's pages under its own key and steps EvDone
//     for the rank whose pages and aux row are verified (I8 per rank); the
//     room expects one completion per decode rank and is Success once every
//     rank did (R11 with real bytes). A lost frame or a slow rank fails the
//     room at its deadline (r11_tp4).
//   - MHA with different TP (head slices): prefill rank s opens one stream
//     per decode rank d in Mapping.PrefillRanks[s].To carrying
//     Mapping.CopiesFrom(s, d), keyed by d and by s (transfer Key.From: a
//     decode rank may take several); only d's AuxFrom sends the aux row.
//     Decode plans the same mapping from its own layout and the prefill TP
//     size (expected_senders, which a multi-rank room's Opens agree on;
//     data_decode.go slicedSources): decode rank d expects one stream per
//     rank of DecodeRanks[d].From with its copies, the aux row from AuxFrom
//     only, and d is done once every one of them completed. A decode room
//     of one rank counts the prefill TP's ranks (poll Ranks =
//     expected_senders): when its rank is done it reports every one of them
//     done, the replicas and MLA dummies that send it nothing too
//     (doneRanks). A rank whose row is one replicated head its source holds
//     alone (rankmap DecodeRank.WholePages) is whole pages on both sides, one
//     stream keyed by d alone, as MLA; the two sides asking one predicate is
//     what TestBothSidesPlanTheSameStreamsForEveryMapping pins. A prefill layout other
//     than the one decode derives sends slices decode does not expect: the
//     receiver refuses them before a byte lands and the room fails invalid;
//     a refused slice reaches a scheduler as ErrBadHeadSlice /
//     ErrHeadSliceMismatch. A room's fence covers every stream key its
//     shares or expectations opened, not only its local ranks' keys.
//   - served: every mapping rankmap plans (equal TP, MLA, MHA between TP
//     sizes whose heads divide).
//
// A rank's new generation (or its UnregisterRegion) fails the rooms holding
// data-plane state on that rank (decode: that rank's metadata; prefill: a
// binding of that rank) with region_replaced: a room spans every rank, so
// such a room fails whole. Rooms with no state on that rank yet are
// untouched and go on over the new file. A replaced file seen before the
// engine registers it fails the room region_replaced too: at its bind or
// Send (one stat), or on prefill when decoded's same-host stat of the
// prefill file saw it (the RESULT's region_replaced; decode's room then
// ends aborted:remote naming it, as on TCP). RegisterRegion's
// rooms_failed counts those rooms with its own, and the file counts once
// per generation in pdlink_region_replaced_total, whoever saw it first.
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
// goroutine publishes them as it steps, by a send that never blocks. The
// config's Ended hook hears every room's end in the same step, and
// drops none: it feeds the duration histograms, which a subscription that
// drops for a slow reader could not.
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
// Send waiting for admission into the peer's in-flight budget (docs/history/room-PLAN.md
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
//     rejects, retransmits, peers, restarts, Watch drops); feed the
//     duration histograms from the config's Ended hook (quick, never
//     blocking: it runs inside the owner's step).
package room
