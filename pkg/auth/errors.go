package auth

import "errors"

// Sentinel errors. Every error the package returns wraps one of them.
var (
	// ErrTokenFile: the token file cannot be read or holds no usable token
	// (empty, shorter than MinTokenLen, too many tokens).
	ErrTokenFile = errors.New("auth: bad token file")
	// ErrMACMissing: a control frame carries no MAC while a secret is configured.
	ErrMACMissing = errors.New("auth: frame has no MAC")
	// ErrMACMalformed: a control frame's MAC is not MACLen bytes long.
	ErrMACMalformed = errors.New("auth: frame MAC has the wrong length")
	// ErrMACInvalid: a control frame's MAC matches no accepted token.
	ErrMACInvalid = errors.New("auth: frame MAC does not verify")
	// ErrTokenRetired: a MAC or proof was made with a token whose overlap
	// window has ended (a peer still runs with the old token).
	ErrTokenRetired = errors.New("auth: made with a retired token")
	// ErrChallengeFailed: the peer's data-connection proof matches no
	// accepted token.
	ErrChallengeFailed = errors.New("auth: peer failed the challenge")
	// ErrChallengeRefused: the peer closed the connection after our proof:
	// it does not accept our token.
	ErrChallengeRefused = errors.New("auth: peer refused our proof")
	// ErrChallengeProtocol: the peer does not speak the auth preface (wrong
	// magic or version, or it echoed our nonce).
	ErrChallengeProtocol = errors.New("auth: peer does not speak the auth preface")
	// ErrChallengeTimeout: the preface did not finish before the deadline.
	ErrChallengeTimeout = errors.New("auth: challenge timed out")
	// ErrInsecureListen: a non-loopback listen address with no secret and
	// no --insecure.
	ErrInsecureListen = errors.New("auth: refusing to listen on a non-loopback address without a shared secret")
	// ErrBadListen: a listen address CheckListen cannot parse.
	ErrBadListen = errors.New("auth: bad listen address")
)
