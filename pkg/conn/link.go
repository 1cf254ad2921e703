package conn

import (
	"go.uber.org/zap"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/poll"
)

// The link/room seam. A link (prefillLink in link_prefill.go, decodeLink in
// link_decode.go) owns the transport side: sockets and sessions, the codec,
// validation, reliable delivery (reliable.go: seq, ACK, retransmit,
// dedupe), peers, REGISTER, heartbeats and liveness, GOODBYE and
// departures. The room side (PrefillNode, DecodeNode with core.go,
// fence.go, read.go, drain.go and the room frame handlers) owns the
// poll.Table and everything that steps it. The link reaches the room side
// only through roomSide; the room side reaches peers only through its
// link's methods (target, sendFollowing, session, peers, counters) and the
// opaque target handles the link hands it.

// roomSide is what a link delivers to its room side and asks of it. Every
// delivery is a direct call on the goroutine that read the frame (the
// listener worker, a session's receive worker) or on the tick worker; the
// owner goroutine of PLAN step 3 turns these calls into Events. A peer's
// frames are delivered one at a time in the order its connection
// delivered them, duplicates never.
type roomSide interface {
	// frameIn is a valid, non-duplicate room frame (METADATA, ABORT,
	// STATUS, ABORT_ACK, or one this side never receives) from the peer
	// behind from; its answer is the frame's ACK. from is the handle to
	// send replies about the frame to.
	frameIn(from target, ft FrameType, env *pdlinkv1.Envelope) ackResult
	// peerLost: the peer id was silent for HeartbeatMisses intervals.
	peerLost(id poll.PeerID)
	// peerRestarted: a new incarnation replaced old. On decode the
	// session goes on as id (REGISTER to it already on its way); on
	// prefill id is NoPeer (the new one registered as a new peer). The
	// old incarnation's queued frames are dropped (before this call on
	// prefill, right after it on decode).
	peerRestarted(old, id poll.PeerID)
	// peerGone: the peer id said goodbye; the link forgot it.
	peerGone(id poll.PeerID, fields ...zap.Field)
	// liveRooms is the live-room count heartbeats carry.
	liveRooms() uint32
}

// finishFrame counts a rejection, remembers a final answer and sends it.
func (c *core) finishFrame(dest target, from string, seq uint64, a ackResult, remember func(uint64, ackResult)) {
	if a.result == pdlinkv1.AckResult_ACK_RESULT_REJECTED {
		r := RejectInvalid
		for _, x := range AllRejectReasons() {
			if x.String() == a.reason {
				r = x
			}
		}
		c.reject(r, from, nil)
	}
	if seq == 0 {
		return
	}
	if a.final() {
		remember(seq, a)
	}
	c.sendAck(dest, seq, a)
}

// sendHeartbeat sends one HEARTBEAT (best effort) carrying live rooms.
func (c *core) sendHeartbeat(dest target, live uint32) {
	env := c.envelope(0)
	env.Body = &pdlinkv1.Envelope_Heartbeat{Heartbeat: &pdlinkv1.Heartbeat{LiveRooms: live}}
	_, _ = c.transmit(dest, env)
}
