// Package poll is pdlink's room state machine and room table. It is pure:
// no sockets, no goroutines, no clock. Events go in through one entry point
// (Step), time goes in as an argument, and the work for the drivers comes
// out as a batch of effects (Ready/Advance, as in etcd raft).
//
// # The machine
//
// A room is one request's transfer on one side, keyed by (room id, nonce).
// States: Bootstrapping -> WaitingForInput -> Transferring -> Success, and
// Failed from any non-terminal state. Every legal move is a cell of one
// table (moves.go, I2); apply is the only function that changes a room's
// state after Open. Illegal events are rejected with a sentinel error,
// counted by RejectReason, and never applied. Success and Failed are
// sticky (I1). Failure reasons are a closed set (Reason, AllReasons).
//
// Per side (the machine is the same, Config.Side changes two effects):
//
//	event        prefill (prefilld)                  decode (decoded)
//	EvOpen       OpenSender; nonce usually 0         OpenReceiver with the nonce it drew
//	             (unbound), peer usually NoPeer      and its prefill daemon as peer
//	EvMetadata   decode's METADATA arrived: binds    prefill acknowledged its METADATA
//	             nonce, peer and expected ranks
//	EvFirstChunk scheduler's first Send              first chunk written
//	EvProgress   pages sent                          pages written
//	EvDone       decode's STATUS Success (per rank)  pages + aux verified (per rank);
//	                                                 emits NotifyPeer(Success)
//	EvPeerStatus decode's STATUS Failed              prefill's STATUS Failed
//
// Multi-rank (R11): a room expects Ranks distinct sending ranks (1..64,
// set on Open or Metadata); it becomes Success when every distinct rank
// (Event.Rank, 0..Ranks-1) is Done; duplicate ranks are ignored, each new
// rank refreshes the idle deadline.
//
// Failures caused here (timeout, local abort, shutdown) emit NotifyPeer to
// the bound peer (R8). Failures the peer caused (EvAbortRemote,
// EvPeerStatus) get the local reason aborted:remote and keep the peer's
// reason in RoomInfo.PeerReason, so each side's failure metrics count only
// the causes it diagnosed. EvPeerLost and EvPeerRestarted fail every live
// room bound to that peer (R10) through a per-peer intrusive index.
// EvPeerReplaced is decode's form of a prefill restart, naming the new
// instance too: a room still Bootstrapping (its METADATA never applied by
// the old instance) moves to the new one (EffRebound) instead of failing,
// so the first room after a restart is served; the others fail with
// peer_restarted and the new instance is told (NotifyPeer). Prefill keeps
// EvPeerRestarted: a decode peer holds every room from its Open.
//
// # Room ids, nonces and unknown rooms
//
// At most one room per room id is in the table (live or terminal and not yet
// cleared). Open of a held id with another nonce is refused with
// ErrCollision and counted; the existing room is untouched (R5). Open of
// the same key again is ErrAlreadyExists. Frame events (EvMetadata,
// EvAbortRemote, EvPeerStatus) must carry the nonce; local events may carry
// nonce 0, meaning "the room with this id". A nonce that is not the room's
// is rejected (ErrNonceMismatch) and, for a peer's frame, answered with
// Failed(collision) and counted as a collision, as is a room failed
// because the peer said collision (Stats.Collisions). An unbound prefill
// room accepts the first nonce (its METADATA binds it), unless that exact
// nonce belongs to a request that ended here (an ended tombstone): that
// frame is late, not for this room.
//
// Nothing but EvOpen creates a room (I3). An event about a room id not in
// the table returns ErrNotFound and, if it came from a peer, a ReplyUnknown
// effect: NotOpen when never seen (the peer may retry until its own
// deadline, because decode's metadata legitimately races prefill's open),
// or Ended with the final state and reason when an ended tombstone (left by
// clear and reap, TTL'd) remembers it (ErrRoomEnded; R2, R3). A room that
// ended unbound (prefill, nonce 0) remembers no request: the first
// METADATA or STATUS it answers Ended binds it to that frame's nonce, and a
// failure (ABORT, STATUS Failed) with a nonce it has not learned is the
// next request's early abort and leaves an abort tombstone (R4 across
// reuse).
// Without decode's nonce relayed to OpenSender a request's first frame
// cannot tell which request it belongs to; this errs towards failing at
// once, the same answer the reused id's open room gives that frame. A peer's
// frame about a room that is terminal here is answered with the outcome
// (NotifyPeer) too. An abort for a room not yet opened leaves an abort
// tombstone (I4); the next Open of that key (or of that room id when a
// nonce is missing on either side) creates the room directly in Failed with
// the abort's reason (every matching abort tombstone is consumed; the
// oldest one's reason wins). Tombstones are bounded by MaxTombstones
// (oldest evicted, counted) and TombstoneTTL, and there is at most one
// abort and one ended tombstone per room id (a newer one replaces the
// older), so no sequence of frames can build long chains.
//
// # Deadlines and time
//
// Time is int64 monotonic nanoseconds from the driver's clock (for example
// int64(time.Since(start)) with one start per process). Time never goes
// backwards inside a table: an earlier value is clamped to the latest seen.
// Every state has a deadline (R9): bootstrap, waiting, transfer idle (no
// progress for that long) and, for terminal rooms, the clear linger. They
// live in a pkg/inflight queue. Step and Tick first expire every deadline
// up to now: a live room past its deadline fails with timeout:<state> (I5)
// and a terminal room past the linger is reaped with reason uncleared
// (I7). So no room is ever observed past its deadline, and a room's
// terminal state is at most one tick interval late.
//
// # Fencing (I9)
//
// A move to Failed emits Fence. Internally the room is Failed at once (so
// frames and timeouts treat it as terminal), but Poll keeps reporting the
// previous state until the driver steps EvFenced for it; then Publish is
// emitted and Poll reports Failed. Clear of an unfenced room is
// ErrNotTerminal. Success needs no fence. A room born Failed (abort before
// open) had no worker and is born fenced.
//
// # Removal (I6)
//
// Clear (scheduler, terminal and visible rooms only) and reap remove a room
// in the same call from the room map, the inflight queue and the peer index,
// and leave an ended tombstone. CheckInvariants verifies that all of them
// agree.
//
// # Ownership and performance
//
// A Table is not safe for concurrent use: it has a single owner. We
// recommend one mutex per daemon around Step, Tick, Poll, Get, List and
// Stats and the Ready/Advance drain (copy the effects out, perform them
// after unlocking). Measured on this machine (AMD EPYC, 2 cores, shared):
// Step is about 130 ns and 0 allocations (4.3M transitions/s, 7.6M
// events/s on one core, with rooms and tombstones pooled); behind a mutex
// from 2 goroutines it stays about 130 ns per Step; Poll of 1000 rooms in
// a 100k-room table takes about 28 µs (PollStatus, with nonces and
// reasons, about 40 µs); a live room costs about 280 bytes
// (history ring included). A scheduler step polling 1000 rooms therefore
// holds the lock for tens of microseconds, and the daemon's event rate is
// orders of magnitude below what one core sustains: sharding would add
// cross-shard peer loss and shutdown for no gain. An actor goroutine
// works as well; either way exactly one goroutine at a time touches the
// table.
//
// # Usage
//
// The driver (the daemon's room owner) must:
//
//  1. Build the table once with New(cfg) (cfg validated, DefaultConfig as
//     a base) and keep it behind one owner (mutex or actor).
//  2. Step every event with the current monotonic time: scheduler calls
//     (Open, FirstChunk/Progress on prefill, AbortLocal, Clear), frames
//     (Metadata, PeerStatus, AbortRemote, Done on prefill) after mapping
//     wire reasons with ParseReason, data-plane progress on decode, and
//     peer loss or restart (intern peers so a restarted instance gets a
//     new PeerID; decode steps EvPeerReplaced with both ids, prefill
//     EvPeerRestarted).
//  3. Call Tick(now) at least every tick interval (or sleep until
//     NextDeadline); the tick interval adds to every deadline bound.
//  4. After each Step or Tick batch, take Ready(), call Advance(), and
//     perform the effects outside the lock: NotifyPeer (send STATUS or
//     ABORT), ReplyUnknown (answer NotOpen or Ended), Fence (stop the
//     room's worker, then Step EvFenced for that room), Transition and
//     Publish (metrics, Watch streams: only Visible transitions and
//     Publish go to the scheduler), Reaped and Removed (free the room's
//     resources in the drivers), Rebound (frames about the room waiting
//     for an answer go to its new peer once that peer registered us).
//  5. Answer the scheduler's Poll from PollStatus (Poll when only states
//     are wanted), GetRoom from Get, ListRooms from List, and metrics from
//     Stats.
package poll
