package room

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/pdlink/pdlink/pkg/conn"
	"github.com/pdlink/pdlink/pkg/poll"
)

// Script commands that call the nodes as their schedulers and data planes
// would (see TestScript for the list).

func (e *scriptEnv) cmdOpen(a scriptArgs) error {
	room, err := a.room(0)
	if err != nil {
		return err
	}
	s, err := a.side()
	if err != nil {
		return err
	}
	ranks, err := a.intArg("ranks", 0)
	if err != nil {
		return err
	}
	rank, err := rankArg(a)
	if err != nil {
		return err
	}
	if _, err := e.node(s); err != nil {
		e.logf("error: %v", err)
		return nil
	}
	desc := fmt.Sprintf("open %d on %v", room, s)
	if s == sideDecode {
		e.call(s, desc, func() string {
			nonce, err := e.dec.OpenRank(room, prefillAddr, ranks, rank)
			if err != nil {
				return e.answer(err, "")
			}
			return "ok: nonce " + e.key(poll.Key{Room: room, Nonce: nonce})
		})
		return nil
	}
	var nonce poll.Nonce
	if v, ok := a.kv["nonce"]; ok {
		if nonce, err = e.nonceArg(v); err != nil {
			return err
		}
	}
	e.call(s, desc, func() string {
		open := func() (poll.RoomInfo, error) { return e.pre.Open(room, nonce, ranks) }
		if rank.Size > 1 {
			open = func() (poll.RoomInfo, error) { return e.pre.OpenRank(room, nonce, rank) }
		}
		info, err := open()
		if err != nil {
			return e.answer(err, "")
		}
		return "ok: " + e.formatVisible(info, info.Visible)
	})
	return nil
}

// rankArg is the rank=R/S argument (rank 0 of 1 without one).
func rankArg(a scriptArgs) (Rank, error) {
	r, ok := a.kv["rank"]
	if !ok {
		return Rank{Size: 1}, nil
	}
	rank, size, _ := strings.Cut(r, "/")
	rv, err1 := strconv.ParseUint(rank, 10, 16)
	sv, err2 := strconv.ParseUint(size, 10, 16)
	if err1 != nil || err2 != nil {
		return Rank{}, fmt.Errorf("rank %q: want R/S", r)
	}
	return Rank{TP: uint16(rv), Size: uint16(sv)}, nil
}

// formatVisible renders the state a scheduler sees, with the reasons once
// Failed is visible.
func (e *scriptEnv) formatVisible(info poll.RoomInfo, visible poll.State) string {
	s := visible.String()
	if visible == poll.Failed {
		s += " reason=" + string(info.Reason)
		if info.PeerReason != "" {
			s += " peer_reason=" + string(info.PeerReason)
		}
	}
	return s
}

func (e *scriptEnv) cmdMetadata(a scriptArgs) error {
	room, err := a.room(0)
	if err != nil {
		return err
	}
	pages, err := parsePages(a.kv["pages"])
	if err != nil {
		return err
	}
	aux, err := a.intArg("aux", 0)
	if err != nil {
		return err
	}
	rank, err := rankArg(a)
	if err != nil {
		return err
	}
	req := MetadataRequest{DstPages: pages, AuxIndex: uint32(aux), Rank: rank}
	if _, err := e.node(sideDecode); err != nil {
		e.logf("error: %v", err)
		return nil
	}
	e.call(sideDecode, fmt.Sprintf("metadata %d", room), func() string {
		return e.answer(e.dec.SendMetadata(room, req), "ok")
	})
	return nil
}

func (e *scriptEnv) cmdSend(a scriptArgs) error {
	room, err := a.room(0)
	if err != nil {
		return err
	}
	pages, err := parsePages(a.kv["pages"])
	if err != nil {
		return err
	}
	last := len(a.pos) > 1 && a.pos[1] == "last"
	if _, err := e.node(sidePrefill); err != nil {
		e.logf("error: %v", err)
		return nil
	}
	e.call(sidePrefill, fmt.Sprintf("send %d", room), func() string {
		if err := e.pre.FirstSend(room); err != nil {
			return e.answer(err, "")
		}
		info, _ := e.pre.Get(room)
		what := "pages=" + formatPages(pages)
		if last {
			what += " last"
		}
		e.logf("prefill dp: sending %s %s", e.key(info.Key), what)
		return "ok"
	})
	return nil
}

// cmdDataPlane plays a data plane's callback: decode wrote and verified a
// rank (complete), bytes moved (progress), the transfer failed (fail).
func (e *scriptEnv) cmdDataPlane(verb string, a scriptArgs) error {
	room, err := a.room(0)
	if err != nil {
		return err
	}
	s := sideDecode
	switch {
	case verb == "fail" && a.on == "":
		s = sidePrefill
	case verb != "complete":
		if s, err = a.side(); err != nil {
			return err
		}
	}
	c, err := e.node(s)
	if err != nil {
		e.logf("error: %v", err)
		return nil
	}
	info, err := c.Get(room)
	if err != nil {
		e.logf("error: %s", e.sanitize(err.Error()))
		return nil
	}
	key := info.Key
	desc := fmt.Sprintf("%s %d on %v", verb, room, s)
	switch verb {
	case "complete":
		rank, err := a.intArg("rank", 0)
		if err != nil {
			return err
		}
		if e.dps[sideDecode].isFenced(key) {
			e.logf("decode dp: %s is fenced: nothing written", e.key(key))
			return nil
		}
		e.call(s, desc, func() string {
			e.dec.OnProgress(key)
			e.dec.OnRankDone(key, rank)
			return e.taken(s)
		})
	case "progress":
		e.call(s, desc, func() string {
			if s == sidePrefill {
				e.pre.OnProgress(key)
			} else {
				e.dec.OnProgress(key)
			}
			return e.taken(s)
		})
	case "fail":
		if len(a.pos) < 2 {
			return fmt.Errorf("fail <room> <reason>")
		}
		reason := poll.Reason(a.pos[1])
		e.call(s, desc, func() string {
			if s == sidePrefill {
				e.pre.OnFailed(key, reason)
			} else {
				e.dec.OnFailed(key, reason)
			}
			return e.taken(s)
		})
	}
	return nil
}

// taken answers a data-plane callback once the owner of side s took it:
// the callbacks are events nobody waits for, so an input queued behind
// them (the owner runs its inputs in order) marks where their effects end
// and the script traces them before the callback's "ok".
func (e *scriptEnv) taken(s scriptSide) string {
	c, err := e.node(s)
	if err != nil {
		return "ok"
	}
	c.exec(func() {})
	return "ok"
}

func (e *scriptEnv) cmdRoom(verb string, a scriptArgs) error {
	room, err := a.room(0)
	if err != nil {
		return err
	}
	s, err := a.side()
	if err != nil {
		return err
	}
	c, err := e.node(s)
	if err != nil {
		e.logf("error: %v", err)
		return nil
	}
	switch verb {
	case "abort":
		var reason poll.Reason
		if len(a.pos) > 1 {
			reason = poll.Reason(a.pos[1])
		}
		e.call(s, fmt.Sprintf("abort %d on %v", room, s), func() string {
			if s == sidePrefill {
				return e.answer(e.pre.Abort(context.Background(), room, reason), "ok")
			}
			return e.answer(e.dec.Abort(context.Background(), room, reason), "ok")
		})
	case "clear":
		e.call(s, fmt.Sprintf("clear %d on %v", room, s), func() string {
			errs := make([]error, 1)
			c.Clear([]poll.RoomID{room}, errs)
			return e.answer(errs[0], "ok")
		})
	case "poll":
		visible := c.Poll([]poll.RoomID{room}, nil)[0]
		info, err := c.Get(room)
		line := visible.String()
		if err == nil {
			line = e.formatVisible(info, visible)
			if info.State != visible {
				line += fmt.Sprintf(" (table: %s, fenced=%v)", e.formatVisible(info, info.State), info.Fenced)
			}
		}
		e.logf("%s", line)
	}
	return nil
}

func (e *scriptEnv) cmdStatus() {
	for _, s := range []scriptSide{sidePrefill, sideDecode} {
		c, err := e.node(s)
		if err != nil {
			e.logf("%s: not running", e.instance(s))
			continue
		}
		st := c.Stats()
		e.logf("%s: rooms=%d inflight=%d tombstones=%d", e.instance(s), st.Rooms, st.Inflight, st.Tombstones)
		now := c.now()
		for _, in := range roomsOf(c) {
			line := fmt.Sprintf("  %s %s", e.key(in.Key), e.formatVisible(in, in.State))
			if in.Visible != in.State {
				line += " visible=" + in.Visible.String()
			}
			line += fmt.Sprintf(" ranks=%d/%d", popcount(in.RanksDone), in.Ranks)
			line += fmt.Sprintf(" deadline=+%v", time.Duration(in.Deadline-now))
			e.logf("%s", line)
		}
		var peers []conn.PeerInfo
		if s == sidePrefill {
			peers = e.pre.Peers()
		} else {
			peers = e.dec.Peers()
		}
		for _, p := range peers {
			up := "down"
			if p.Up {
				up = "up"
			}
			e.logf("  peer %s %s", p.Instance, up)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.appendLocked(fmt.Sprintf("links: p->d %v, d->p %v", e.modes[dirPD], e.modes[dirDP]))
}

func popcount(x uint64) int {
	n := 0
	for ; x != 0; x &= x - 1 {
		n++
	}
	return n
}

func (e *scriptEnv) cmdCounters() {
	for _, s := range []scriptSide{sidePrefill, sideDecode} {
		var c conn.Counters
		switch {
		case !e.alive[s]:
			e.logf("%s: not running", e.instance(s))
			continue
		case s == sidePrefill:
			c = e.pre.Counters()
		default:
			c = e.dec.Counters()
		}
		var parts []string
		for _, r := range conn.AllRejectReasons() {
			if n := c.Rejected(r); n > 0 {
				parts = append(parts, fmt.Sprintf("rejected_%s=%d", r, n))
			}
		}
		for _, x := range []struct {
			name string
			n    uint64
		}{{"retransmits", c.Retransmits}, {"give_ups", c.GiveUps}, {"worker_restarts", c.WorkerRestarts},
			{"peers_lost", c.PeersLost}, {"peer_restarts", c.PeerRestarts}, {"peer_goodbyes", c.PeerGoodbyes}} {
			if x.n > 0 {
				parts = append(parts, fmt.Sprintf("%s=%d", x.name, x.n))
			}
		}
		if len(parts) == 0 {
			parts = append(parts, "none")
		}
		e.logf("%s: %s", e.instance(s), strings.Join(parts, " "))
	}
}
