// Package conn is pdlink's daemon-to-daemon link: frames, the reliable
// session layer above a best-effort Transport, peers and heartbeats. It
// carries the frames of the room owners (package room: PrefillOwner in
// prefilld, DecodeOwner in decoded) and never imports them: it delivers to
// an owner through the RoomSide it is given and sends what the owner asks.
//
// # Layers
//
//	Transport (transport.go)  best-effort frames: zmtp (ZeroMQ) in the daemons,
//	                          MemNetwork here for tests (loss, duplication,
//	                          reordering, delay, partition, listener death)
//	Codec (codec.go)          Envelope <-> bytes; size, version, MAC
//	                          (Authenticator hook, NoAuth default) and the
//	                          validity rules of wire.proto/common.proto
//	                          (validate.go); every error maps to a
//	                          RejectReason
//	reliable (reliable.go)    seq per (instance, epoch); ACK per frame with
//	                          seq; retransmit with exponential backoff and
//	                          jitter until the ACK or the frame's give-up
//	                          deadline; a dedupe window per peer incarnation
//	                          re-acks duplicates without re-applying them
//	links (link.go,           sockets and sessions, frame intake, reliable
//	link_prefill.go,          sends, peers (PrefillLink: registry by
//	link_decode.go,           instance, id and endpoint; DecodeLink: one
//	goodbye.go, peer.go,      session per prefill address, REGISTER),
//	supervisor.go,            heartbeats and liveness, GOODBYE and
//	counters.go, clock.go)    departures; the supervisor of the node's
//	                          workers, counters, the node's Clock
//
// The seam is one place (link.go): a link delivers to its room side only
// through RoomSide (FrameIn, PeerLost, PeerRestarted, PeerGone; LiveRooms
// for heartbeats); the room side reaches peers only through its link
// (Target handles, Link.Send, Link.Ack, Link.Cancel,
// DecodeLink.SendFollowing/Session, Peers, Counters).
//
// A room frame is handed over, not waited for: the reader gives FrameIn
// the frame and an AckToken and goes back to its socket; package room
// queues it for its owner goroutine, which steps it, performs the effects
// in table order and sends the frame's ACK last (Link.Ack: the ACK is an
// effect of the step), or gives the token back unanswered (Link.Cancel:
// the owner stopped, or the step panicked). While a token is out, a
// retransmit of its frame is dropped as a duplicate, neither stepped
// again nor answered early: the owner's ACK answers it, or the next
// retransmit finds the answer in the dedupe window. At most
// Config.MaxUnansweredFrames (and MaxUnansweredBytes) are out; a room
// frame past that is dropped unanswered and counted (RejectOwnerBusy,
// pdlink_frames_rejected_total{reason="owner_busy"}), and the peer
// retransmits it. Heartbeats, ACKs, REGISTER and duplicates are the
// link's own and never queue behind the owner; an ACK's answer to a
// METADATA is posted to the owner (DecodeLink.SendFollowing's onAck must
// not wait). PeerRestarted and PeerGone, once per peer incarnation, are
// the only deliveries a reader waits for.
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
// The link's workers run under its supervisor (Link.Go), which recovers
// panics, logs them at Error, counts them (Counters.WorkerRestarts) and
// restarts the worker with backoff (R6):
//   - prefill: one listener worker (PrefillLink.Listen), the only reader
//     of the bootstrap socket (re-binds the address if the socket dies);
//   - decode: one worker per prefill address (DecodeLink.Session), the
//     only reader of its Conn (dials again if the Conn dies, then
//     registers again);
//   - the room side's tick worker (package room) runs under the same
//     supervisor and calls Link.Tick: retransmits, heartbeats, liveness.
//     It queues the owner's part of the tick without waiting for it.
//
// So a busy room owner (a 100k-room drain step, a large METADATA, a test
// holding it) holds no reader and no tick worker: its peer's frames are
// read, heartbeats keep leaving and arriving, and nobody is declared lost
// while its frames sit in our own socket. The peer/session mutex and the
// outbox mutex are never held together, and no transport call is made
// under either (except the sends of MemNetwork, which never block).
//
// Time comes from a Clock: RealClock in the daemons, FakeClock in tests,
// which makes every scenario deterministic (node time, Link.Now, is
// nanoseconds since the link was made).
//
// # Usage
//
// Package room builds the links (NewPrefillLink, NewDecodeLink) with the
// node's Config and its RoomSide; the daemons build the room owners, not
// links. The ZeroMQ implementation of Transport lives in package zmtp.
package conn
