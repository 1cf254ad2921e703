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
		c.sendReliable(t, env, poll.Key{}, giveUp, nil, func(poll.PeerID, AckResult) bool {
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
