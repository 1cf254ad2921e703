// Package conn is pdlink's daemon-to-daemon control plane: frames, the
// reliable session layer above a best-effort Transport, peers and
// heartbeats, and the two room owners (PrefillNode in prefilld, DecodeNode
// in decoded) that turn frames, scheduler calls and data-plane callbacks
// into events for a poll.Table.
//
// # Layers
//
//	Transport (transport.go)  best-effort frames: zmtp (ZeroMQ) in the daemons,
//	                          MemNetwork here for tests (loss, duplication,
//	                          reordering, delay, partition, listener death)
//	Codec (codec.go)          Envelope <-> bytes; size, version, MAC
//	                          (Authenticator hook, NoAuth default) and the
//	                          validity rules of wire.proto/common.proto;
//	                          every error maps to a RejectReason
//	reliable (reliable.go)    seq per (instance, epoch); ACK per frame with
//	                          seq; retransmit with exponential backoff and
//	                          jitter until the ACK or the frame's give-up
//	                          deadline; a dedupe window per peer incarnation
//	                          re-acks duplicates without re-applying them
//	links (link.go,           the transport side of a node: sockets and
//	link_prefill.go,          sessions, frame intake, reliable sends,
//	link_decode.go,           peers (prefill: registry by instance, id and
//	goodbye.go,               endpoint; decode: one session per prefill
//	supervisor.go)            address, REGISTER), heartbeats and liveness,
//	                          GOODBYE and departures
//	rooms (core.go, fence.go, one poll.Table behind one mutex; transitions
//	read.go, drain.go,        published under it, other effects performed
//	prefill.go,               outside it; fences, parked calls, Watch,
//	prefill_frames.go,        drain; the room frames (METADATA, ABORT,
//	decode.go,                STATUS, ABORT_ACK) and the scheduler and
//	decode_rooms.go,          data-plane calls
//	dataplane.go)
//
// The seam between the two is one place (link.go): a link delivers to its
// room side only through roomSide (frameIn, whose answer is the frame's
// ACK; peerLost, peerRestarted, peerGone; liveRooms for heartbeats), as a
// direct call on the goroutine that read the frame or on the tick worker;
// the room side reaches peers only through its link (target handles,
// linkBase.send, decodeLink.sendFollowing/session, peerInfos, counters).
// The owner goroutine of pkg/room's PLAN (step 3) replaces the direct
// calls by a bounded event queue.
//
// # Protocol
//
// decoded dials one Conn per prefill address, lazily, on the first Open for
// it, and sends REGISTER (instance, data endpoint, layouts) first. prefilld
// learns decode peers only from REGISTER (any other frame from an unknown
// instance is rejected as unknown_peer and answered so the peer registers
// again) and binds a room to the peer whose METADATA it applies. A room
// flows:
//
//	decode                          prefill
//	Open (draws nonce)              Open (nonce 0: unbound)
//	SendMetadata: Expect, METADATA ->  EvMetadata, Bind  (NOT_OPEN: retried
//	EvMetadata on ACK APPLIED    <- ACK               until decode's deadline)
//	pages arrive (data plane)      <- FirstSend (scheduler), pages move
//	EvDone per rank; Success:
//	STATUS(Success)              -> EvDone for every rank -> Success
//	                             <- ACK
//
// Failures caused on one side (scheduler abort, timeout, data-plane error,
// shutdown) send ABORT with the reason (R8); the receiver fails the room
// (aborted:remote, the peer's reason kept as PeerReason), ACKs at once,
// and sends ABORT_ACK once its data plane is fenced: it will not read or
// write the room any more. An ABORT for a room not opened yet leaves a tombstone and the later
// Open is born Failed (R4). A frame about a room that ended is answered ACK
// ENDED with the reason, and the sender fails at once; no state is created
// (R3). A frame about a room bound to another peer, or another request's
// nonce, is rejected as foreign_room.
//
// Heartbeats flow both ways every HeartbeatInterval; any valid frame counts
// as one. A peer unheard for HeartbeatMisses intervals is lost and every
// room bound to it fails with peer_lost. A new instance behind the same
// address (decode: same data endpoint in REGISTER; prefill: a new sender on
// the same Conn) with a higher epoch is a restart: rooms bound to the old
// instance fail with peer_restarted at once, its queued frames are dropped,
// and decode registers again (R10). On decode, a room whose METADATA the
// old prefill instance never applied (still Bootstrapping) is not failed
// but moved to the new instance (poll.EvPeerReplaced): a METADATA follows
// its session's current instance and goes again as soon as the new
// REGISTER is acknowledged, so the first room after a restart is served.
//
// A node that stops cleanly (Shutdown at the end of the drain, or Close)
// sends GOODBYE to its peers once its rooms' notices are acknowledged, and
// retries it within the drain. A peer that receives it fails what is still
// bound to the sender (aborted:remote, peer reason shutdown) and forgets it
// at once: it is counted in PeerGoodbyes, never lost, and a later instance
// registers as a new peer. Late frames of the departed incarnation are
// refused (stale_epoch) and a repeated GOODBYE is acknowledged again. If
// no GOODBYE arrives, the sender is lost after missed heartbeats, as if it
// had vanished (goodbye.go).
//
// ACK results: APPLIED (took effect, or had already: handlers are
// idempotent), NOT_OPEN (retry until your own deadline), ENDED (reason
// empty: ended in Success; else the failure reason), REJECTED (reason is a
// RejectReason; unknown_peer means register and retry). Only final answers
// enter the dedupe window, so a retried NOT_OPEN frame is processed again.
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
// Watch (Subscribe) sees each room's transitions in table order: they are
// published while the table lock is held, by a send that never blocks.
//
// # Hostile input (R12)
//
// A frame over Limits.MaxFrameBytes, one that does not decode, speaks
// another version, fails the MAC, breaks a validity rule, names too many
// pages/runs/layouts/buffers, comes from an unknown peer or an old epoch,
// or touches another peer's room is rejected and counted by reason
// (Counters.Rejected); the log line is rate limited per reason. Nothing a
// peer sends stops the listener.
//
// # Goroutines and locks
//
// Each node runs, under a supervisor that recovers panics, logs them at
// Error, counts them (Counters.WorkerRestarts) and restarts the worker with
// backoff (R6):
//   - the tick worker (core.go, the room side's): poll Tick and fence
//     retries, then the link's retransmits, heartbeats and peer liveness;
//   - prefill: one listener worker (the link's, link_prefill.go), the only
//     reader of the bootstrap socket (re-binds the address if the socket
//     dies); the room frames it reads run the room side on it;
//   - decode: one worker per prefill address (the link's, link_decode.go),
//     the only reader of its Conn (dials again if the Conn dies, then
//     registers again); the room frames it reads run the room side on it.
//
// So a room side that blocks in a delivery holds that reader (its peer's
// frames wait), never the tick worker: heartbeats keep leaving and the
// peer keeps counting this node up.
//
// Scheduler calls and data-plane callbacks run on their callers'
// goroutines; no goroutine of the node waits for a fence. Locks: the table
// mutex, the peer/session mutex, the outbox mutex and the fence mutex are
// never held together; the subscriber mutex is taken only alone or inside
// the table mutex (publication, which never blocks). No data-plane or
// transport call is made under any of them (except the transport sends of
// MemNetwork, which never block).
//
// Time comes from a Clock: RealClock in the daemons, FakeClock in tests,
// which makes every scenario deterministic (the table's time is nanoseconds
// since the node started).
//
// # Usage
//
// The daemon (and its gRPC services) must:
//
//  1. Build the node with NewPrefillNode/NewDecodeNode (Transport, Logger,
//     poll limits, timings in Config; a data plane adapter), then Start it
//     before any other call. On shutdown call Shutdown (bounded by the
//     drain: rooms fail with shutdown, the peers are told until they
//     acknowledge, then hear GOODBYE), then Close (which alone tells them
//     once).
//  2. Map scheduler calls: prefill Open/FirstSend/Abort/Clear/Poll/Get/List;
//     decode Open (returns the nonce)/SendMetadata/Abort/Clear/Poll/Get/List;
//     pass Abort the caller's ctx (it may wait for the fence).
//     Errors are poll's or this package's sentinels; map them to gRPC codes
//     at the service edge.
//  3. Route data-plane callbacks to the node: OnProgress, OnFailed,
//     Fenced for a Fence that answered not done, and on decode OnRankDone
//     once a rank's pages and aux row are verified (I8). The data plane's
//     Fence must be sticky and must not wait (see PrefillDataPlane).
//  4. Serve Watch from Subscribe (bounded; Dropped counts what a slow
//     reader missed) and metrics from Stats (rooms) and Counters (frames,
//     rejects, retransmits, peers, restarts).
//
// The ZeroMQ implementation of Transport lives in package zmtp.
package conn
