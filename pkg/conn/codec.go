package conn

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
)

// ProtocolVersion is the Envelope version this package speaks.
const ProtocolVersion = 1

// FrameType names an Envelope body (pdlink_frames_total{type}).
type FrameType uint8

// Frame types.
const (
	FrameRegister FrameType = iota
	FrameMetadata
	FrameAbort
	FrameAbortAck
	FrameStatus
	FrameHeartbeat
	FrameAck
	FrameGoodbye
	numFrameTypes
)

var frameNames = [numFrameTypes]string{"register", "metadata", "abort", "abort_ack", "status", "heartbeat", "ack", "goodbye"}

func (t FrameType) String() string {
	if t < numFrameTypes {
		return frameNames[t]
	}
	return "unknown"
}

// AllFrameTypes returns every frame type, for metrics.
func AllFrameTypes() []FrameType {
	out := make([]FrameType, numFrameTypes)
	for i := range out {
		out[i] = FrameType(i)
	}
	return out
}

// Reliable reports whether frames of this type carry a seq and wait for an ACK.
func (t FrameType) Reliable() bool { return t != FrameHeartbeat && t != FrameAck && t < numFrameTypes }

// FrameTypeOf returns the type of env's body; ok is false when it has none.
func FrameTypeOf(env *pdlinkv1.Envelope) (FrameType, bool) {
	switch env.GetBody().(type) {
	case *pdlinkv1.Envelope_Register:
		return FrameRegister, true
	case *pdlinkv1.Envelope_Metadata:
		return FrameMetadata, true
	case *pdlinkv1.Envelope_Abort:
		return FrameAbort, true
	case *pdlinkv1.Envelope_AbortAck:
		return FrameAbortAck, true
	case *pdlinkv1.Envelope_Status:
		return FrameStatus, true
	case *pdlinkv1.Envelope_Heartbeat:
		return FrameHeartbeat, true
	case *pdlinkv1.Envelope_Ack:
		return FrameAck, true
	case *pdlinkv1.Envelope_Goodbye:
		return FrameGoodbye, true
	}
	return 0, false
}

// Authenticator seals and verifies envelopes. The MAC covers the envelope
// serialised (deterministically) with mac empty, which includes the sender,
// epoch and seq, so a replay or a forgery fails Verify. NoAuth is the
// default; a later issue adds HMAC-SHA256 with token rotation.
type Authenticator interface {
	// Seal returns the MAC of unsealed, or nil to send no MAC.
	Seal(unsealed []byte) ([]byte, error)
	// Verify checks mac (possibly empty) against unsealed.
	Verify(unsealed, mac []byte) error
}

// NoAuth sends no MAC and accepts every frame.
type NoAuth struct{}

// Seal implements Authenticator.
func (NoAuth) Seal([]byte) ([]byte, error) { return nil, nil }

// Verify implements Authenticator.
func (NoAuth) Verify([]byte, []byte) error { return nil }

// Codec turns Envelopes into frames and back. Decode checks everything a
// receiver can check without state: size, encoding, version, MAC, and the
// validity rules of the proto comments. It is safe for concurrent use.
type Codec struct {
	Limits Limits
	Auth   Authenticator // nil: NoAuth
}

var marshalOpts = proto.MarshalOptions{Deterministic: true}

// Encode serialises env (its Mac is ignored) and appends the MAC, if the
// Authenticator gives one, as field 5.
func (c *Codec) Encode(env *pdlinkv1.Envelope) ([]byte, error) {
	mac := env.Mac
	env.Mac = nil
	b, err := marshalOpts.Marshal(env)
	env.Mac = mac
	if err != nil {
		return nil, fmt.Errorf("conn: encode: %w", err)
	}
	if c.Auth != nil {
		m, err := c.Auth.Seal(b)
		if err != nil {
			return nil, fmt.Errorf("conn: seal: %w", err)
		}
		if len(m) > 0 {
			b = protowire.AppendTag(b, 5, protowire.BytesType)
			b = protowire.AppendBytes(b, m)
		}
	}
	if len(b) > c.Limits.maxFrame() {
		return nil, fmt.Errorf("%w: %d bytes", ErrFrameTooLarge, len(b))
	}
	return b, nil
}

// Decode parses and validates one frame. Every error wraps one of
// ErrFrameTooLarge, ErrDecode, ErrVersion, ErrAuth, ErrInvalidFrame or
// ErrTooMany (see RejectReasonOf).
func (c *Codec) Decode(frame []byte) (*pdlinkv1.Envelope, error) {
	if len(frame) > c.Limits.maxFrame() {
		return nil, fmt.Errorf("%w: %d bytes", ErrFrameTooLarge, len(frame))
	}
	env := &pdlinkv1.Envelope{}
	if err := proto.Unmarshal(frame, env); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrDecode, err)
	}
	if env.ProtocolVersion != ProtocolVersion {
		return nil, fmt.Errorf("%w: %d", ErrVersion, env.ProtocolVersion)
	}
	if c.Auth != nil {
		if _, isNoAuth := c.Auth.(NoAuth); !isNoAuth {
			mac := env.Mac
			env.Mac = nil
			b, err := marshalOpts.Marshal(env)
			env.Mac = mac
			if err != nil {
				return nil, fmt.Errorf("%w: %v", ErrDecode, err)
			}
			if err := c.Auth.Verify(b, mac); err != nil {
				return nil, fmt.Errorf("%w: %w", ErrAuth, err)
			}
		}
	}
	if err := ValidateEnvelope(env, c.Limits); err != nil {
		return nil, err
	}
	return env, nil
}
