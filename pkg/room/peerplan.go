package room

import (
	"sort"
	"sync"

	"go.uber.org/zap"

	"github.com/pdlink/pdlink/pkg/rankmap"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// peerPlans holds, per decode peer (by data address), the rank mapping between this
// side's layout and the peer's REGISTER layout, or the refusal: computed once per pair of
// layouts (the first bind after a REGISTER, a peer's new layout or a new local region),
// so a refusal is logged and counted once, not per room. The fan-out step reads the
// Mapping from here. Safe for concurrent use: the owner writes, operators read.
type peerPlans struct {
	mu      sync.Mutex
	byPeer  map[string]*peerPlan
	refused map[string]uint64 // by transfer.RefusalReason
}

type peerPlan struct {
	local, peer transfer.Layout
	mapping     rankmap.Mapping
	err         error
}

// PeerPlan is one decode peer's rank mapping as an operator sees it.
type PeerPlan struct {
	Peer      string `json:"peer"`
	PrefillTP int    `json:"prefill_tp"`
	DecodeTP  int    `json:"decode_tp"`
	// Described is true when both layouts give their head shape (the mapping came from
	// rankmap.Plan); false for the opaque comparison.
	Described bool `json:"described"`
	Identity  bool `json:"identity"`
	// Refused is the refusal reason (transfer.RefusalReason) and Error its message; both
	// empty when the peer maps.
	Refused string `json:"refused,omitempty"`
	Error   string `json:"error,omitempty"`
}

// plan returns the refusal of the pair (local, peer) for addr, computing it unless the
// same pair was planned last for addr.
func (p *peerPlans) plan(log *zap.Logger, addr string, local, peer transfer.Layout) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pp := p.byPeer[addr]; pp != nil && pp.local.Equal(local) && pp.peer.Equal(peer) {
		return pp.err
	}
	m, err := transfer.PlanRanks(local, peer)
	if p.byPeer == nil {
		p.byPeer, p.refused = map[string]*peerPlan{}, map[string]uint64{}
	}
	p.byPeer[addr] = &peerPlan{local: local, peer: peer, mapping: m, err: err}
	if err != nil {
		reason := transfer.RefusalReason(err)
		p.refused[reason]++
		log.Warn("decode peer layout refused", zap.String("peer", addr), zap.String("reason", reason), zap.Error(err))
		return err
	}
	log.Info("decode peer layout mapped", zap.String("peer", addr), zap.Int("prefill_tp", m.Prefill.TP),
		zap.Int("decode_tp", m.Decode.TP), zap.Bool("described", local.Described() && peer.Described()), zap.Bool("identity", m.Identity()))
	return nil
}

// mapping is the rank mapping kept for addr (false when none, or refused).
func (p *peerPlans) mapping(addr string) (rankmap.Mapping, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pp := p.byPeer[addr]
	if pp == nil || pp.err != nil {
		return rankmap.Mapping{}, false
	}
	return pp.mapping, true
}

// list is every peer's plan, by address.
func (p *peerPlans) list() []PeerPlan {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]PeerPlan, 0, len(p.byPeer))
	for addr, pp := range p.byPeer {
		v := PeerPlan{Peer: addr, PrefillTP: int(pp.local.Rank.Size), DecodeTP: int(pp.peer.Rank.Size),
			Described: pp.local.Described() && pp.peer.Described(), Identity: pp.err == nil && pp.mapping.Identity()}
		if pp.err != nil {
			v.Refused, v.Error = transfer.RefusalReason(pp.err), pp.err.Error()
		}
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Peer < out[j].Peer })
	return out
}

// refusals is how many peer layouts were refused, by reason.
func (p *peerPlans) refusals(reason string) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refused[reason]
}

// PeerLayoutRefusalReasons is the closed set of reasons a decode peer's layout is refused
// for (the reason label of pdlink_peer_layout_refused_total).
func PeerLayoutRefusalReasons() []string { return transfer.RefusalReasons() }
