package transfer

import (
	"fmt"
	"net"
	"slices"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Refusal is why decode's receiver refused a data frame: the closed set of the reason label
// of pdlink_data_refused_total (Receiver.Refused). Each refusal is counted and logged
// (rate limited per reason), so a room that prefill saw rejected or fenced by the receiver
// has its cause on decode too.
type Refusal uint8

const (
	// RefusedUnknownRoom: a stream's DONE named a key that is not expected here: one never
	// expected (the two daemons planned different streams for the room, e.g. whole pages
	// against head slices) or one forgotten after its fence (an aborted room's late DONE).
	// The sender is answered fenced.
	RefusedUnknownRoom Refusal = iota
	// RefusedInvalid: a chunk or DONE did not match its room's expectation (pages, head
	// slices, sequence, totals, aux row, a missing checksum); the room failed invalid.
	RefusedInvalid
	// RefusedBadFrame: a header, frame type or run list that fails its checks; the
	// connection cannot be trusted further and breaks, its rooms fail transfer_error.
	RefusedBadFrame
	// RefusedChecksum: a chunk's bytes (its payload on tcp, decode's copy on the same
	// host) did not match the crc32c prefill sent; the room failed checksum.
	RefusedChecksum
	numRefusals
)

var refusalNames = [numRefusals]string{"unknown_room", "invalid", "bad_frame", "checksum"}

func (r Refusal) String() string {
	if r < numRefusals {
		return refusalNames[r]
	}
	return fmt.Sprintf("refusal(%d)", uint8(r))
}

// AllRefusals returns every Refusal, in a stable order (the metric exports each, zeros too).
func AllRefusals() []Refusal {
	out := make([]Refusal, numRefusals)
	for i := range out {
		out[i] = Refusal(i)
	}
	return out
}

// Refused is how many data frames the receiver refused for reason.
func (r *Receiver) Refused(reason Refusal) uint64 {
	if reason >= numRefusals {
		return 0
	}
	return r.refused[reason].Load()
}

// refuse counts a refused frame and logs it, one line per reason per second: a peer
// whose every chunk is refused must not flood the log. fields add what the caller knows
// (the room, the expected keys).
func (r *Receiver) refuse(reason Refusal, remote net.Addr, err error, fields ...zap.Field) {
	r.refused[reason].Add(1)
	n, ok := r.refusalLog.Allow(reason)
	if !ok {
		return
	}
	level := zapcore.WarnLevel
	if reason == RefusedUnknownRoom {
		level = zapcore.InfoLevel // also the late DONE of an aborted room: routine
	}
	if ce := r.log.Check(level, "data frame refused"); ce != nil {
		ce.Write(append(fields, zap.Stringer("reason", reason), zap.Stringer("remote", remote), zap.Error(err),
			zap.Uint64("suppressed", n))...)
	}
}

// expectedBeside is, as a log field, the keys expected for the same room, nonce and decode
// rank as key: the streams decode planned where the sender sent key, so the two plans can be
// compared. It scans the rooms only when the line is written (rate limited).
type expectedBeside struct {
	r   *Receiver
	key Key
}

func (e expectedBeside) String() string {
	e.r.mu.Lock()
	var out []Key
	for k := range e.r.rooms {
		if k.Room == e.key.Room && k.Nonce == e.key.Nonce && k.Rank == e.key.Rank {
			out = append(out, k)
		}
	}
	e.r.mu.Unlock()
	slices.SortFunc(out, func(a, b Key) int { return int(a.From.TP) - int(b.From.TP) })
	return fmt.Sprint(out)
}
