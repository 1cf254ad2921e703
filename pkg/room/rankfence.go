package room

import (
	"sync"
	"sync/atomic"

	"github.com/pdlink/pdlink/pkg/transfer"
)

// rankFences fences a room on a data plane that keys it per rank: the
// room is fenced (the node's Fenced, I9) only once every rank's share is,
// whichever order the data plane reports them in. A room of one rank
// (tp_size 1) goes straight through: its data plane's OnFenced is the
// node's Fenced, as before ranks.
type rankFences struct {
	mu sync.Mutex
	// pending are the groups still waiting for a key's OnFenced.
	pending map[transfer.Key][]*fenceGroup
}

// fenceGroup is one Fence of a room over its rank keys: left counts the
// keys not yet let go, plus one the caller holds until every key was
// asked.
type fenceGroup struct {
	left   atomic.Int32
	fenced func()
}

// fence asks fence for every key; done when no worker holds any of them.
// Otherwise fenced runs once the last one let go (from onFenced).
func (f *rankFences) fence(keys []transfer.Key, fence func(transfer.Key) bool, fenced func()) bool {
	if len(keys) == 1 {
		return fence(keys[0])
	}
	g := &fenceGroup{fenced: fenced}
	g.left.Store(int32(len(keys)) + 1)
	f.mu.Lock()
	if f.pending == nil {
		f.pending = map[transfer.Key][]*fenceGroup{}
	}
	for _, k := range keys {
		f.pending[k] = append(f.pending[k], g)
	}
	f.mu.Unlock()
	for _, k := range keys {
		if !fence(k) {
			continue
		}
		if f.drop(k, g) {
			g.left.Add(-1)
		}
	}
	return g.left.Add(-1) == 0
}

// drop removes g from k's waiters; false when onFenced took it already.
func (f *rankFences) drop(k transfer.Key, g *fenceGroup) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	gs := f.pending[k]
	for i, x := range gs {
		if x == g {
			gs = append(gs[:i], gs[i+1:]...)
			if len(gs) == 0 {
				delete(f.pending, k)
			} else {
				f.pending[k] = gs
			}
			return true
		}
	}
	return false
}

// onFenced is the data plane's OnFenced for k: single is the node's
// Fenced for a room of one rank.
func (f *rankFences) onFenced(k transfer.Key, single func()) {
	if k.Rank.Size <= 1 {
		single()
		return
	}
	f.mu.Lock()
	gs := f.pending[k]
	delete(f.pending, k)
	f.mu.Unlock()
	for _, g := range gs {
		if g.left.Add(-1) == 0 {
			g.fenced()
		}
	}
}
