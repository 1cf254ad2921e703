package poll

import "fmt"

// RoomID is the 63-bit request id the router gives both engines.
type RoomID uint64

// Nonce is drawn by the decode daemon when it creates the receiver and
// travels in every frame about the room. Zero means "unbound" on a room
// (prefill before METADATA) and "local, match by room id" on an event.
type Nonce uint64

// Key identifies one room: two requests that share a RoomID have different
// nonces and never touch each other's state.
type Key struct {
	Room  RoomID
	Nonce Nonce
}

func (k Key) String() string { return fmt.Sprintf("%d/%d", k.Room, k.Nonce) }

// PeerID names a peer daemon instance. The driver interns peer identities
// (one id per instance, so a restarted peer gets a new id). Zero is NoPeer.
type PeerID uint32

// NoPeer marks a room with no bound peer, or an event of local origin.
const NoPeer PeerID = 0

// State is a room state. The numeric values are identifiers only: nothing
// compares them for order (I2).
type State uint8

// Room states. StateNone is not a room state: Poll reports it for a room id
// not in the table.
const (
	StateNone State = iota
	Bootstrapping
	WaitingForInput
	Transferring
	Success
	Failed

	numStates = iota
)

var stateNames = [numStates]string{"NotFound", "Bootstrapping", "WaitingForInput", "Transferring", "Success", "Failed"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Terminal reports whether s is Success or Failed.
func (s State) Terminal() bool { return s == Success || s == Failed }

// AllStates returns the room states (StateNone excluded), for metrics.
func AllStates() []State {
	return []State{Bootstrapping, WaitingForInput, Transferring, Success, Failed}
}

// EventKind says what happened to a room.
type EventKind uint8

// Event kinds. See the move table in moves.go and doc.go for the per-side
// meaning.
const (
	evNone EventKind = iota
	// EvOpen: the local scheduler creates the room (the only event that
	// creates state).
	EvOpen
	// EvMetadata: prefill: decode's METADATA arrived (binds nonce and
	// peer); decode: prefill acknowledged its metadata.
	EvMetadata
	// EvFirstChunk: prefill: the scheduler's first Send; decode: first
	// chunk written. In Transferring it counts as progress (another rank).
	EvFirstChunk
	// EvProgress: bytes moved; refreshes the Transferring idle deadline.
	EvProgress
	// EvDone: one rank (Event.Rank) finished: decode: pages and aux
	// verified; prefill: decode's STATUS Success.
	EvDone
	// EvPeerStatus: the peer reported the room Failed (Event.Reason is the
	// peer's reason).
	EvPeerStatus
	// EvAbortLocal: the local scheduler or daemon aborts the room
	// (Event.Reason: any failure reason, default aborted:local).
	EvAbortLocal
	// EvAbortRemote: the peer's ABORT frame (Event.Reason: peer's reason).
	EvAbortRemote
	// EvTimeout is produced internally when a deadline passes; Step
	// rejects it.
	EvTimeout
	// EvPeerLost fails every live room bound to Event.Peer.
	EvPeerLost
	// EvPeerRestarted fails every live room bound to Event.Peer (the old
	// instance).
	EvPeerRestarted
	// EvFenced: the driver stopped the room's worker; the scheduler may now
	// see Failed (I9).
	EvFenced
	// EvClear: the scheduler is done with a terminal room; it is removed.
	EvClear
	// EvShutdown fails every live room with reason shutdown.
	EvShutdown
	// EvPeerReplaced (decode only): the prefill daemon behind Event.Peer
	// restarted as Event.NewPeer. Each live room bound to the old instance
	// takes its move: one whose METADATA the old instance never applied
	// (Bootstrapping) moves to NewPeer (EffRebound), since no prefill
	// instance holds state for it; the others fail with peer_restarted and
	// NewPeer is told.
	EvPeerReplaced

	numEventKinds = iota
)

var eventNames = [numEventKinds]string{"none", "open", "metadata", "first_chunk", "progress", "done",
	"peer_status", "abort_local", "abort_remote", "timeout", "peer_lost", "peer_restarted", "fenced", "clear", "shutdown", "peer_replaced"}

func (k EventKind) String() string {
	if int(k) < len(eventNames) {
		return eventNames[k]
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// fromPeer reports whether events of kind k always come from a peer frame
// (they must carry a nonce).
func (k EventKind) fromPeer() bool {
	return k == EvMetadata || k == EvPeerStatus || k == EvAbortRemote
}

// MaxRanks is the largest number of sending ranks a room may expect.
const MaxRanks = 64

// Event is one input to Step. It is a plain struct so Step does not
// allocate.
type Event struct {
	Kind EventKind
	// Key names the room. Nonce 0 on a local event means "the room with
	// this id, whatever its nonce"; frame events must carry the nonce.
	Key Key
	// Peer: for EvOpen the peer the room is bound to (decode: its prefill
	// daemon; prefill: usually NoPeer); for a frame event the sender; for
	// EvPeerLost/EvPeerRestarted/EvPeerReplaced the peer concerned;
	// NoPeer if local.
	Peer PeerID
	// NewPeer: for EvPeerReplaced, the restarted peer's new instance
	// (neither NoPeer nor Peer); NoPeer on every other event.
	NewPeer PeerID
	// Reason: for aborts and EvPeerStatus.
	Reason Reason
	// Ranks: expected ranks (1..64) on EvOpen or EvMetadata; 0 = unset.
	Ranks uint8
	// Rank: the index of the sending rank that finished, on EvDone (0..Ranks-1);
	// on EvMetadata, the index of the METADATA's decode rank (0..Addressed-1).
	Rank uint8
	// Addressed: on EvMetadata (prefill), how many METADATA frames, one per
	// decode rank, the room waits for before it is WaitingForInput (R11: a
	// rank's Send must find its destination); 0 or 1 means the first.
	Addressed uint8
}

// EffectKind says what the driver must do.
type EffectKind uint8

// Effect kinds.
const (
	_ EffectKind = iota // zero is no effect
	// EffNotifyPeer: tell Peer that Key is now Status (Success or Failed
	// with Reason): a STATUS or ABORT frame.
	EffNotifyPeer
	// EffReplyUnknown: a frame named a room not in the table; answer Peer
	// with Reply (NotOpen: retry until your own deadline; Ended: the room
	// ended with Status/Reason).
	EffReplyUnknown
	// EffFence: stop the room's worker from reading/writing its pages, then
	// step EvFenced (I9).
	EffFence
	// EffTransition: the room moved From -> To at At (metrics, history,
	// Watch when Visible).
	EffTransition
	// EffPublish: a fenced Failed room is now visible to the scheduler.
	EffPublish
	// EffReaped: a terminal room nobody cleared was removed (I7).
	EffReaped
	// EffRemoved: the scheduler cleared the room.
	EffRemoved
	// EffRebound: the room moved to Peer, the new instance of a peer that
	// restarted (EvPeerReplaced); its state (Status) is unchanged. The
	// frames about it still waiting for an answer now go to Peer.
	EffRebound
)

var effectNames = [...]string{"none", "notify_peer", "reply_unknown", "fence", "transition", "publish", "reaped", "removed", "rebound"}

func (k EffectKind) String() string {
	if int(k) < len(effectNames) {
		return effectNames[k]
	}
	return fmt.Sprintf("EffectKind(%d)", uint8(k))
}

// ReplyKind qualifies EffReplyUnknown.
type ReplyKind uint8

// Reply kinds.
const (
	ReplyNone ReplyKind = iota
	// ReplyNotOpen: never seen; the peer may retry until its own deadline
	// (decode's metadata legitimately races prefill's open).
	ReplyNotOpen
	// ReplyEnded: the room ended recently; Status and Reason say how.
	ReplyEnded
)

func (r ReplyKind) String() string {
	switch r {
	case ReplyNotOpen:
		return "not_open"
	case ReplyEnded:
		return "ended"
	}
	return "none"
}

// Effect is one piece of work for the driver. Fields not relevant to Kind
// are zero.
type Effect struct {
	Kind    EffectKind
	Key     Key
	Peer    PeerID
	From    State
	To      State
	Status  State
	Reply   ReplyKind
	Visible bool
	Reason  Reason
	// PeerReason is the peer's reason on a move to Failed the peer caused
	// (Reason aborted:remote), on EffTransition and EffPublish.
	PeerReason Reason
	At         int64
	// Opened is when the room was opened and Entered when it entered
	// From (Opened for an open), on EffTransition: a room's life and the
	// time it spent in From, for the duration metrics. A room enters
	// Transferring at its first KV byte and stays there across progress,
	// so Entered of its move to Success is when its transfer began.
	Opened, Entered int64
}
