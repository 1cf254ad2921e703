package auth

import (
	"errors"
	"sync/atomic"
)

// Reason says why a frame or a data connection was refused
// (pdlink_auth_rejected_total{reason}). The mac_* reasons are control
// frames, the challenge_* reasons data connections.
type Reason uint8

// Reject reasons.
const (
	ReasonMACMissing        Reason = iota // control frame without a MAC
	ReasonMACMalformed                    // MAC of the wrong length
	ReasonMACInvalid                      // MAC matches no accepted token (forged, or an unknown token)
	ReasonMACRetired                      // MAC made with a token whose overlap window ended
	ReasonChallengeFailed                 // peer's proof matches no accepted token
	ReasonChallengeRetired                // peer's proof made with a retired token
	ReasonChallengeRefused                // peer closed after our proof (it does not accept our token)
	ReasonChallengeProtocol               // peer does not speak the preface (no auth configured there?)
	ReasonChallengeTimeout                // the preface did not finish in time
	ReasonChallengeIO                     // the connection broke during the preface
	numReasons
)

var reasonNames = [numReasons]string{
	"mac_missing", "mac_malformed", "mac_invalid", "mac_retired_token",
	"challenge_failed", "challenge_retired_token", "challenge_refused",
	"challenge_protocol", "challenge_timeout", "challenge_io",
}

func (r Reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return "unknown"
}

// AllReasons returns every reason, for metrics (export each one, even at 0).
func AllReasons() []Reason {
	out := make([]Reason, numReasons)
	for i := range out {
		out[i] = Reason(i)
	}
	return out
}

// ReasonOf maps an error returned by this package onto its Reason; ok is
// false for other errors.
func ReasonOf(err error) (Reason, bool) {
	var e *rejectError
	if errors.As(err, &e) {
		return e.reason, true
	}
	return 0, false
}

// rejectError carries the Reason of a refusal next to its sentinel.
type rejectError struct {
	reason Reason
	err    error // wraps a sentinel
}

func (e *rejectError) Error() string { return e.err.Error() }
func (e *rejectError) Unwrap() error { return e.err }

// counters are shared by a Keyring's authenticators.
type counters struct {
	rejected        [numReasons]atomic.Uint64
	sealed          atomic.Uint64
	verified        atomic.Uint64
	verifiedOther   atomic.Uint64
	handshakes      atomic.Uint64
	handshakesOther atomic.Uint64
	reloads         atomic.Uint64
	reloadErrors    atomic.Uint64
}

// Stats is a snapshot of a Keyring's counters (all monotonic).
type Stats struct {
	rejected [numReasons]uint64
	// Sealed counts control frames MAC'd; Verified those whose MAC verified,
	// VerifiedOther those among them made with a token other than the one we
	// sign with (a peer that has not rotated yet, or has rotated first).
	Sealed, Verified, VerifiedOther uint64
	// Handshakes counts data-connection prefaces that succeeded (both
	// directions), HandshakesOther those proven with a token other than the
	// one we sign with.
	Handshakes, HandshakesOther uint64
	// Reloads counts successful Reloads that changed the tokens;
	// ReloadErrors the refused ones (the previous tokens stay in force).
	Reloads, ReloadErrors uint64
}

// Rejected returns the count for one reason.
func (s Stats) Rejected(r Reason) uint64 {
	if r >= numReasons {
		return 0
	}
	return s.rejected[r]
}

// RejectedTotal returns the sum over every reason.
func (s Stats) RejectedTotal() uint64 {
	var n uint64
	for _, v := range s.rejected {
		n += v
	}
	return n
}

func (c *counters) snapshot() Stats {
	var s Stats
	for i := range c.rejected {
		s.rejected[i] = c.rejected[i].Load()
	}
	s.Sealed, s.Verified, s.VerifiedOther = c.sealed.Load(), c.verified.Load(), c.verifiedOther.Load()
	s.Handshakes, s.HandshakesOther = c.handshakes.Load(), c.handshakesOther.Load()
	s.Reloads, s.ReloadErrors = c.reloads.Load(), c.reloadErrors.Load()
	return s
}

// reject counts a refusal and returns it as an error wrapping sentinel.
func (c *counters) reject(r Reason, err error) error {
	c.rejected[r].Add(1)
	return &rejectError{reason: r, err: err}
}
