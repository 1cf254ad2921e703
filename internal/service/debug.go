package service

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/pdlink/pdlink/pkg/poll"
	"github.com/pdlink/pdlink/pkg/room"
)

type debugRoom struct {
	Room       uint64         `json:"room"`
	Nonce      uint64         `json:"nonce"`
	State      string         `json:"state"`
	Visible    string         `json:"visible_state"`
	Reason     string         `json:"reason,omitempty"`
	PeerReason string         `json:"peer_reason,omitempty"`
	Peer       string         `json:"peer,omitempty"`
	AgeSeconds float64        `json:"age_seconds"`
	InState    float64        `json:"state_age_seconds"`
	DeadlineIn float64        `json:"deadline_in_seconds"`
	History    []debugHistory `json:"history"`
}

type debugHistory struct {
	At     time.Time `json:"at"`
	From   string    `json:"from"`
	To     string    `json:"to"`
	Reason string    `json:"reason,omitempty"`
}

// DebugRooms serves /debug/rooms: every room the daemon holds (live ones
// and terminal ones not cleared yet) as JSON, oldest first within the page,
// with ?state= (any spelling poll.ParseState reads: waiting_for_input,
// WaitingForInput, ROOM_STATE_WAITING_FOR_INPUT...), ?min_age= (a Go
// duration) and ?limit= (default 1000).
func DebugRooms(a *AdminServer) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		q := req.URL.Query()
		var f poll.Filter
		if s := q.Get("state"); s != "" {
			st, err := poll.ParseState(s)
			if err != nil {
				http.Error(w, "state: "+err.Error(), http.StatusBadRequest)
				return
			}
			f.State = st
		}
		if s := q.Get("min_age"); s != "" {
			d, err := time.ParseDuration(s)
			if err != nil || d < 0 {
				http.Error(w, "min_age: want a duration like 5s", http.StatusBadRequest)
				return
			}
			f.MinAge = d
		}
		limit := 1000
		if s := q.Get("limit"); s != "" {
			var n int
			if err := json.Unmarshal([]byte(s), &n); err != nil || n < 1 || n > 100000 {
				http.Error(w, "limit: want 1..100000", http.StatusBadRequest)
				return
			}
			limit = n
		}
		infos, next, err := a.Owner.List(f, "", limit)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		now := a.Now()
		out := struct {
			// Region is the mapped region file (generation included), so
			// an engine restart shows here as a new generation.
			Region *room.RegionFile `json:"region,omitempty"`
			// Peers are the decode peers' rank mappings (prefill only):
			// which ones map and which were refused, and why.
			Peers     []room.PeerPlan `json:"peers,omitempty"`
			Rooms     []debugRoom     `json:"rooms"`
			Truncated bool            `json:"truncated"`
		}{Rooms: []debugRoom{}, Truncated: next != ""}
		if ro, ok := a.Owner.(interface{ Region() room.RegionFile }); ok {
			if id := ro.Region(); id.Generation != 0 {
				out.Region = &id
			}
		}
		if po, ok := a.Owner.(interface{ PeerPlans() []room.PeerPlan }); ok {
			out.Peers = po.PeerPlans()
		}
		for _, in := range infos {
			created := a.Owner.WallTime(in.CreatedAt)
			r := debugRoom{
				Room: uint64(in.Key.Room), Nonce: uint64(in.Key.Nonce),
				State: in.State.String(), Visible: in.Visible.String(),
				Reason: string(in.Reason), PeerReason: string(in.PeerReason), Peer: a.peerName(in.Peer),
				AgeSeconds: now.Sub(created).Seconds(),
				InState:    now.Sub(a.Owner.WallTime(in.StateEnteredAt)).Seconds(),
				DeadlineIn: a.Owner.WallTime(in.Deadline).Sub(now).Seconds(),
				History:    []debugHistory{},
			}
			for _, h := range in.History {
				r.History = append(r.History, debugHistory{At: a.Owner.WallTime(h.At), From: h.From.String(), To: h.To.String(), Reason: string(h.Reason)})
			}
			out.Rooms = append(out.Rooms, r)
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(out)
	})
}
