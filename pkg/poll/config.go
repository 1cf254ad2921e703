package poll

import (
	"fmt"
	"time"
)

// Side says which daemon the table serves; the machine is the same, a few
// effects differ (see doc.go).
type Side uint8

// Sides.
const (
	Prefill Side = iota + 1
	Decode
)

func (s Side) String() string {
	switch s {
	case Prefill:
		return "prefill"
	case Decode:
		return "decode"
	}
	return "unknown"
}

// HistoryCap is the largest per-room history ring (Config.HistoryLen).
// A normal lifecycle records at most 5 transitions.
const HistoryCap = 8

// Config holds every limit of a Table. All durations are required (R9).
type Config struct {
	Side Side
	// BootstrapTimeout bounds Bootstrapping (waiting for METADATA or its ack).
	BootstrapTimeout time.Duration
	// WaitingTimeout bounds WaitingForInput (waiting for the first chunk).
	WaitingTimeout time.Duration
	// TransferIdleTimeout bounds Transferring without progress.
	TransferIdleTimeout time.Duration
	// ClearLinger: a terminal room not cleared after this is reaped (I7).
	ClearLinger time.Duration
	// MaxRooms bounds the rooms in the table (live and terminal).
	MaxRooms int
	// TombstoneTTL and MaxTombstones bound abort (I4) and ended (R2/R3)
	// tombstones; the oldest is evicted (and counted) past the cap.
	TombstoneTTL  time.Duration
	MaxTombstones int
	// OverdueFraction in (0, 1]: a room is overdue past this fraction of
	// its state's deadline.
	OverdueFraction float64
	// HistoryLen is the per-room history ring size, 1..HistoryCap.
	HistoryLen int
}

// DefaultConfig returns sensible limits for side.
func DefaultConfig(side Side) Config {
	return Config{
		Side:                side,
		BootstrapTimeout:    30 * time.Second,
		WaitingTimeout:      60 * time.Second,
		TransferIdleTimeout: 30 * time.Second,
		ClearLinger:         5 * time.Minute,
		MaxRooms:            1 << 20,
		TombstoneTTL:        2 * time.Minute,
		MaxTombstones:       1 << 16,
		OverdueFraction:     0.5,
		HistoryLen:          HistoryCap,
	}
}

// Validate checks cfg and names the faulty field.
func (c Config) Validate() error {
	bad := func(field string, v any, want string) error {
		return fmt.Errorf("poll: Config.%s: %s, got %v", field, want, v)
	}
	switch {
	case c.Side != Prefill && c.Side != Decode:
		return bad("Side", c.Side, "must be Prefill or Decode")
	case c.BootstrapTimeout <= 0:
		return bad("BootstrapTimeout", c.BootstrapTimeout, "must be > 0")
	case c.WaitingTimeout <= 0:
		return bad("WaitingTimeout", c.WaitingTimeout, "must be > 0")
	case c.TransferIdleTimeout <= 0:
		return bad("TransferIdleTimeout", c.TransferIdleTimeout, "must be > 0")
	case c.ClearLinger <= 0:
		return bad("ClearLinger", c.ClearLinger, "must be > 0")
	case c.MaxRooms <= 0:
		return bad("MaxRooms", c.MaxRooms, "must be > 0")
	case c.TombstoneTTL <= 0:
		return bad("TombstoneTTL", c.TombstoneTTL, "must be > 0")
	case c.MaxTombstones <= 0:
		return bad("MaxTombstones", c.MaxTombstones, "must be > 0")
	case !(c.OverdueFraction > 0 && c.OverdueFraction <= 1):
		return bad("OverdueFraction", c.OverdueFraction, "must be in (0, 1]")
	case c.HistoryLen < 1 || c.HistoryLen > HistoryCap:
		return bad("HistoryLen", c.HistoryLen, fmt.Sprintf("must be in 1..%d", HistoryCap))
	}
	return nil
}

// deadline returns the deadline of state s (ClearLinger for terminal ones).
func (c Config) deadline(s State) time.Duration {
	switch s {
	case Bootstrapping:
		return c.BootstrapTimeout
	case WaitingForInput:
		return c.WaitingTimeout
	case Transferring:
		return c.TransferIdleTimeout
	default:
		return c.ClearLinger
	}
}
