package conn

import (
	"context"

	"go.uber.org/zap"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/poll"
)

// A planned stop is not a lost peer. A node that stops cleanly (Shutdown,
// or Close) sends GOODBYE to every peer it is registered with, once its
// rooms' notices are acknowledged, and retries it until each peer has
// acknowledged or the drain ends. The receiver forgets the sender at once
// and counts it in PeerGoodbyes, never in PeersLost: the prefill keeps the
// incarnation as a departure so a retransmit that crossed the ACK is
// acknowledged again (and any other late frame of it refused as
// stale_epoch) instead of registering it anew; the decode drops the
// session, keeping its Conn open a heartbeat bound so it can answer those
// retransmits too. A GOODBYE that never arrives leaves the peer to be lost
// after missed heartbeats, as if it had vanished.

// departure is a decode incarnation that said goodbye to this prefill.
type departure struct {
	epoch uint64
	at    int64 // node time it left
}

// sayGoodbye tells the peers this node is leaving and waits until each
// has acknowledged or ctx ends (a done ctx: one attempt, no wait). It runs
// once per node; afterwards the node does not register again, and a peer
// that acknowledged gets no more heartbeats and is not declared lost.
// Heartbeats go on to the others: a peer that has not heard the goodbye
// yet must not count us lost while we retry it.
func (c *core) sayGoodbye(ctx context.Context) {
	if !c.started.Load() || !c.saidGoodbye.CompareAndSwap(false, true) {
		return
	}
	targets := c.hooks.goodbyeTargets()
	giveUp := c.now() + int64(c.cfg.NotifyHorizon)
	for _, t := range targets {
		env := &pdlinkv1.Envelope{Body: &pdlinkv1.Envelope_Goodbye{Goodbye: &pdlinkv1.Goodbye{}}}
		// Any answer ends it: unknown_peer means the peer does not count
		// us either, and must not make us register again.
		c.sendReliable(t, env, poll.Key{}, giveUp, nil, func(poll.PeerID, ackResult) bool {
			c.hooks.farewell(t)
			return true
		})
	}
	c.log.Info("said goodbye to peers", zap.Int("peers", len(targets)))
	if len(targets) == 0 {
		return
	}
	if !c.out.waitUntil(ctx, func() bool { return c.out.pendingOf(FrameGoodbye) == 0 }) {
		c.log.Warn("goodbye not acknowledged by every peer, they will count us lost",
			zap.Int("unacknowledged", c.out.pendingOf(FrameGoodbye)))
	}
}

// peerDeparted forgets the peer behind id, which said goodbye: rooms still
// bound to it fail as if its shutdown ABORT had arrived (aborted:remote,
// peer reason shutdown), frames queued for it are dropped, and it is
// counted as a goodbye, not as lost.
func (c *core) peerDeparted(id poll.PeerID, fields ...zap.Field) {
	c.ctr.peerGoodbyes.Add(1)
	dropped := c.out.cancelPeer(id)
	rooms := c.roomsBoundTo(id)
	c.log.Info("peer said goodbye", append(fields, zap.Uint32("peer", uint32(id)),
		zap.Int("rooms_failed", len(rooms)), zap.Int("frames_dropped", dropped))...)
	for _, k := range rooms {
		_ = c.step(poll.Event{Kind: poll.EvAbortRemote, Key: k, Peer: id, Reason: poll.ReasonShutdown})
	}
}

// doneContext is an already cancelled context: Close says goodbye once
// without waiting.
func doneContext() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// goodbyeTargets are the decode peers heard from within the heartbeat
// bound.
func (n *PrefillNode) goodbyeTargets() []target {
	n.pmu.Lock()
	defer n.pmu.Unlock()
	var out []target
	for _, p := range n.peers {
		if p.up {
			out = append(out, p)
		}
	}
	return out
}

func (n *PrefillNode) farewell(t target) {
	if p, ok := t.(*decodePeer); ok {
		n.pmu.Lock()
		p.farewell = true
		n.pmu.Unlock()
	}
}

// handleGoodbye forgets a registered decode peer that is leaving. A
// repeat (our ACK was lost) finds it gone and changes nothing.
func (n *PrefillNode) handleGoodbye(p *decodePeer) ackResult {
	n.pmu.Lock()
	if n.peers[p.instance] != p {
		n.pmu.Unlock()
		return ackApplied
	}
	n.dropPeerLocked(p)
	n.departLocked(p.instance, p.epoch, n.now())
	n.pmu.Unlock()
	n.peerDeparted(p.id, zap.String("peer_instance", p.instance), zap.String("endpoint", p.endpoint))
	return ackApplied
}

// departLocked remembers a departed incarnation, bounded by MaxPeers (the
// oldest goes first) and by PeerForgetAfter (see expireDeparturesLocked).
func (n *PrefillNode) departLocked(instance string, epoch uint64, now int64) {
	if n.departed == nil {
		n.departed = make(map[string]departure)
	}
	if _, ok := n.departed[instance]; !ok && len(n.departed) >= n.cfg.MaxPeers {
		oldest, at := "", int64(0)
		for inst, d := range n.departed {
			if oldest == "" || d.at < at {
				oldest, at = inst, d.at
			}
		}
		delete(n.departed, oldest)
	}
	n.departed[instance] = departure{epoch: epoch, at: now}
}

func (n *PrefillNode) expireDeparturesLocked(now int64) {
	for inst, d := range n.departed {
		if now-d.at > int64(n.cfg.PeerForgetAfter) {
			delete(n.departed, inst)
		}
	}
}

// departedLocked reports whether env comes from an incarnation that said
// goodbye (a newer one is a new peer).
func (n *PrefillNode) departedLocked(env *pdlinkv1.Envelope) bool {
	d, ok := n.departed[env.GetSenderInstance()]
	return ok && env.GetEpoch() <= d.epoch
}

// answerDeparted handles a frame from a departed incarnation: its GOODBYE
// again is a duplicate, acknowledged (idempotent); its HEARTBEATs and ACKs
// until it hears that ACK are expected and dropped; any other frame is
// refused as stale_epoch without an answer, so it cannot register again.
func (n *PrefillNode) answerDeparted(route Route, env *pdlinkv1.Envelope, ft FrameType) {
	switch ft {
	case FrameGoodbye:
		n.reject(RejectDuplicate, env.GetSenderInstance(), nil) // as a duplicate of a live peer's would be
		n.sendAck(routeTarget{n: n, route: route}, env.GetSeq(), ackApplied)
	case FrameHeartbeat, FrameAck:
	default:
		n.reject(RejectStaleEpoch, env.GetSenderInstance(), nil)
	}
}
