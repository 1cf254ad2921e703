package auth

import (
	"crypto/hmac"
	"fmt"
)

// Side is the role of the daemon an authenticator runs in. Control MACs are
// bound to the direction of the frame, so a frame reflected back to its
// sender never verifies.
type Side uint8

// Sides.
const (
	SidePrefill Side = iota + 1
	SideDecode
)

func (s Side) String() string {
	switch s {
	case SidePrefill:
		return "prefill"
	case SideDecode:
		return "decode"
	}
	return "unknown"
}

// Control MACs control-plane envelopes; it implements pkg/conn's
// Authenticator (set it as conn.Config.Auth). Seal signs with the token that
// signs now; Verify accepts any token accepted now. Both are safe for
// concurrent use and take no lock.
type Control struct {
	k       *Keyring
	out, in int // ctl index of the frames we send and of those we receive
}

// Control returns the control-plane authenticator of a daemon on side.
func (k *Keyring) Control(side Side) *Control {
	switch side {
	case SidePrefill:
		return &Control{k: k, out: 0, in: 1}
	case SideDecode:
		return &Control{k: k, out: 1, in: 0}
	}
	panic(fmt.Sprintf("auth: Control(%d): unknown side", side))
}

// Seal returns HMAC-SHA256 of unsealed (the envelope serialised with mac
// empty: it covers the sender, epoch, seq and body) under the signing
// token's key for our direction.
func (c *Control) Seal(unsealed []byte) ([]byte, error) {
	s := c.k.ring.Load().signing(c.k.now())
	c.k.ctr.sealed.Add(1)
	return s.ctl[c.out].sum(make([]byte, 0, MACLen), unsealed, nil, nil), nil
}

// Verify checks mac against unsealed under every token accepted now, in
// constant time per token. Errors carry a Reason (ReasonOf) and wrap
// ErrMACMissing, ErrMACMalformed, ErrTokenRetired or ErrMACInvalid.
func (c *Control) Verify(unsealed, mac []byte) error {
	switch {
	case len(mac) == 0:
		return c.k.ctr.reject(ReasonMACMissing, ErrMACMissing)
	case len(mac) != MACLen:
		return c.k.ctr.reject(ReasonMACMalformed, fmt.Errorf("%w: %d bytes", ErrMACMalformed, len(mac)))
	}
	var buf [MACLen]byte
	s, current, retired := c.k.ring.Load().find(c.k.now(), func(s *secret) bool {
		return hmac.Equal(s.ctl[c.in].sum(buf[:0], unsealed, nil, nil), mac)
	})
	switch {
	case s == nil && retired:
		return c.k.ctr.reject(ReasonMACRetired, fmt.Errorf("%w: the sender signs with a token this daemon no longer accepts (overlap window ended)", ErrTokenRetired))
	case s == nil:
		return c.k.ctr.reject(ReasonMACInvalid, ErrMACInvalid)
	case !current:
		c.k.ctr.verifiedOther.Add(1)
	}
	c.k.ctr.verified.Add(1)
	return nil
}
