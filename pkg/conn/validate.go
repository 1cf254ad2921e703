package conn

import (
	"cmp"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/pagelist"
	"github.com/pdlink/pdlink/pkg/poll"
)

// Limits bound what one frame may carry (R12). Zero fields take the
// defaults of DefaultLimits.
type Limits struct {
	// MaxFrameBytes bounds one frame (at most MaxFrameSize). A page list's
	// bounds are not configurable: they are package pagelist's, the same on
	// both sides and at the scheduler's edge.
	MaxFrameBytes int
	// MaxLayouts and MaxBuffers bound a REGISTER's layouts and each
	// layout's buffers.
	MaxLayouts int
	MaxBuffers int
	// MaxString bounds instance ids, endpoints and reasons.
	MaxString int
}

// DefaultLimits returns the limits used when a field is zero.
func DefaultLimits() Limits {
	return Limits{
		MaxFrameBytes: MaxFrameSize,
		MaxLayouts:    64,
		MaxBuffers:    4096,
		MaxString:     256,
	}
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	if l.MaxFrameBytes <= 0 || l.MaxFrameBytes > MaxFrameSize {
		l.MaxFrameBytes = d.MaxFrameBytes
	}
	if l.MaxLayouts <= 0 {
		l.MaxLayouts = d.MaxLayouts
	}
	if l.MaxBuffers <= 0 {
		l.MaxBuffers = d.MaxBuffers
	}
	if l.MaxString <= 0 {
		l.MaxString = d.MaxString
	}
	return l
}

func (l Limits) maxFrame() int { return l.withDefaults().MaxFrameBytes }

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidFrame}, args...)...)
}

// ValidateEnvelope checks env against the rules of wire.proto and
// common.proto: version, sender, epoch, exactly one body, seq present
// exactly on frames that need an ACK, and the body's own rules.
func ValidateEnvelope(env *pdlinkv1.Envelope, lim Limits) error {
	lim = lim.withDefaults()
	if env.GetProtocolVersion() != ProtocolVersion {
		return fmt.Errorf("%w: %d", ErrVersion, env.GetProtocolVersion())
	}
	if s := env.GetSenderInstance(); s == "" || len(s) > lim.MaxString {
		return invalid("sender_instance length %d", len(s))
	}
	if env.GetEpoch() == 0 {
		return invalid("epoch 0")
	}
	ft, ok := FrameTypeOf(env)
	if !ok {
		return invalid("no body")
	}
	if ft.Reliable() != (env.GetSeq() != 0) {
		return invalid("%s with seq %d", ft, env.GetSeq())
	}
	switch ft {
	case FrameRegister:
		return validateRegister(env.GetRegister(), env.GetSenderInstance(), lim)
	case FrameMetadata:
		m := env.GetMetadata()
		if m.GetRoomId() == 0 || m.GetRoomId() >= 1<<63 || m.GetNonce() == 0 {
			return invalid("metadata room %d nonce %d", m.GetRoomId(), m.GetNonce())
		}
		if n := m.GetExpectedSenders(); n < 1 || n > poll.MaxRanks {
			return invalid("expected_senders %d", n)
		}
		if err := validateRank(m.GetRank()); err != nil {
			return err
		}
		if err := validatePageList(m.GetDstPages()); err != nil {
			return err
		}
		if n := pageListLen(m.GetDstPages()); int64(m.GetPrefixLen()) > n {
			return invalid("prefix_len %d of %d pages", m.GetPrefixLen(), n)
		}
		return nil
	case FrameAbort:
		a := env.GetAbort()
		if err := validateKey(a.GetRoomId(), a.GetNonce()); err != nil {
			return err
		}
		return validateReason(a.GetReason(), false)
	case FrameAbortAck:
		return validateKey(env.GetAbortAck().GetRoomId(), env.GetAbortAck().GetNonce())
	case FrameStatus:
		s := env.GetStatus()
		if err := validateKey(s.GetRoomId(), s.GetNonce()); err != nil {
			return err
		}
		if err := validateRank(s.GetRank()); err != nil {
			return err
		}
		switch s.GetState() {
		case pdlinkv1.RoomState_ROOM_STATE_SUCCESS:
			if s.GetReason() != "" {
				return invalid("status success with reason")
			}
			return nil
		case pdlinkv1.RoomState_ROOM_STATE_FAILED:
			return validateReason(s.GetReason(), true)
		}
		return invalid("status state %v", s.GetState())
	case FrameAck:
		a := env.GetAck()
		if a.GetAckedSeq() == 0 {
			return invalid("ack of seq 0")
		}
		switch a.GetResult() {
		case pdlinkv1.AckResult_ACK_RESULT_APPLIED, pdlinkv1.AckResult_ACK_RESULT_NOT_OPEN:
		case pdlinkv1.AckResult_ACK_RESULT_ENDED:
			// Empty reason: the room ended in Success.
			if a.GetReason() != "" {
				return validateReason(a.GetReason(), true)
			}
		case pdlinkv1.AckResult_ACK_RESULT_REJECTED:
			if len(a.GetReason()) > lim.MaxString {
				return invalid("ack reason length %d", len(a.GetReason()))
			}
		default:
			return invalid("ack result %v", a.GetResult())
		}
	case FrameGoodbye:
		// No fields: what it means is all in the envelope (who, which
		// incarnation, a seq to acknowledge), checked above and by the MAC.
		return nil
	}
	return nil
}

func validateKey(room, nonce uint64) error {
	if room == 0 || room >= 1<<63 || nonce == 0 {
		return invalid("room %d nonce %d", room, nonce)
	}
	return nil
}

// validateReason accepts a failure reason of the closed set; an empty one
// only when required is false (ABORT without reason means aborted:remote).
func validateReason(s string, required bool) error {
	if s == "" && !required {
		return nil
	}
	if _, ok := poll.ParseReason(s); !ok {
		return invalid("reason %.32q", s)
	}
	return nil
}

// validateRank accepts an absent rank (rank 0 of 1).
func validateRank(r *pdlinkv1.Rank) error {
	if r == nil {
		return nil
	}
	if r.GetTpSize() < 1 || r.GetTpSize() > poll.MaxRanks || r.GetTpRank() >= r.GetTpSize() {
		return invalid("rank %d/%d", r.GetTpRank(), r.GetTpSize())
	}
	return nil
}

// validatePageList is the frame-in check of a peer's page list (the one
// METADATA carries): exactly one of indices and runs, every index >= 0, runs
// that do not overflow int32, no page twice, and package pagelist's bounds,
// the ones the peer's own edge applied. Whether the pages are inside the
// peer's buffers is the peer's to check, on its edge and on every chunk.
func validatePageList(p *pdlinkv1.PageList) error {
	idx, runs := p.GetIndices(), p.GetRuns()
	switch {
	case len(idx) > 0 && len(runs) > 0, len(idx) == 0 && len(runs) == 0:
		return invalid("page list needs exactly one of indices and runs")
	case len(idx) > pagelist.MaxPages:
		return fmt.Errorf("%w: %d page indices", ErrTooMany, len(idx))
	case len(runs) > pagelist.MaxRuns:
		return fmt.Errorf("%w: %d page runs", ErrTooMany, len(runs))
	case pagelist.IndexBytes(idx) > pagelist.MaxListBytes:
		return fmt.Errorf("%w: page indices encode to %d bytes", ErrTooMany, pagelist.IndexBytes(idx))
	}
	if len(idx) > 0 {
		s := slices.Clone(idx)
		slices.Sort(s)
		if s[0] < 0 {
			return invalid("negative page %d", s[0])
		}
		for i := 1; i < len(s); i++ {
			if s[i] == s[i-1] {
				return invalid("page %d twice", s[i])
			}
		}
		return nil
	}
	type span struct{ lo, hi int64 }
	spans := make([]span, len(runs))
	var total int64
	for i, r := range runs {
		lo, n := int64(r.GetStart()), int64(r.GetCount())
		if lo < 0 || n < 1 || lo+n > math.MaxInt32 {
			return invalid("run %d+%d", lo, n)
		}
		total += n
		spans[i] = span{lo, lo + n}
	}
	if total > pagelist.MaxPages {
		return fmt.Errorf("%w: %d pages in runs", ErrTooMany, total)
	}
	slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
	for i := 1; i < len(spans); i++ {
		if spans[i].lo < spans[i-1].hi {
			return invalid("runs overlap at page %d", spans[i].lo)
		}
	}
	return nil
}

// pageListLen is the number of pages of a list validatePageList accepted.
func pageListLen(p *pdlinkv1.PageList) int64 {
	if idx := p.GetIndices(); len(idx) > 0 {
		return int64(len(idx))
	}
	var n int64
	for _, r := range p.GetRuns() {
		n += int64(r.GetCount())
	}
	return n
}

func validateRegister(r *pdlinkv1.Register, sender string, lim Limits) error {
	if r.GetInstanceId() == "" || r.GetInstanceId() != sender {
		return invalid("register instance %.32q from sender %.32q", r.GetInstanceId(), sender)
	}
	if err := validateEndpoint(r.GetDataEndpoint(), lim); err != nil {
		return err
	}
	if len(r.GetLayouts()) > lim.MaxLayouts {
		return fmt.Errorf("%w: %d layouts", ErrTooMany, len(r.GetLayouts()))
	}
	for _, l := range r.GetLayouts() {
		if err := validateLayout(l, lim); err != nil {
			return err
		}
	}
	return nil
}

func validateEndpoint(ep string, lim Limits) error {
	if len(ep) > lim.MaxString {
		return invalid("data endpoint length %d", len(ep))
	}
	host, port, err := net.SplitHostPort(ep)
	if err != nil || host == "" {
		return invalid("data endpoint %.64q", ep)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return invalid("data endpoint port %.16q", port)
	}
	return nil
}

func validateLayout(l *pdlinkv1.RegionLayout, lim Limits) error {
	if l.GetRank() == nil {
		return invalid("layout without rank")
	}
	if err := validateRank(l.GetRank()); err != nil {
		return err
	}
	if _, known := pdlinkv1.Attention_name[int32(l.GetAttention())]; !known {
		// The head shape itself is the planner's to judge (pkg/transfer.PlanRanks): a
		// layout that cannot map is refused per peer, not as a malformed frame.
		return invalid("layout attention %d", l.GetAttention())
	}
	if len(l.GetBuffers()) > lim.MaxBuffers {
		return fmt.Errorf("%w: %d buffers", ErrTooMany, len(l.GetBuffers()))
	}
	for _, b := range l.GetBuffers() {
		if b.GetItemLen() < 1 || b.GetLength()%uint64(b.GetItemLen()) != 0 || b.GetOffset()+b.GetLength() < b.GetOffset() {
			return invalid("buffer offset %d length %d item_len %d", b.GetOffset(), b.GetLength(), b.GetItemLen())
		}
	}
	if a := l.GetAux(); a != nil && (a.GetRowLen() < 1 || a.GetRows() < 1) {
		return invalid("aux row_len %d rows %d", a.GetRowLen(), a.GetRows())
	}
	return nil
}
