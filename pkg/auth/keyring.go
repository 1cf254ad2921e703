package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pdlink/pdlink/pkg/loglimit"
	"go.uber.org/zap"
)

// Limits and defaults.
const (
	// MinTokenLen is the shortest token accepted, in bytes after trimming.
	MinTokenLen = 32
	// MaxTokens is the most tokens one file may hold.
	MaxTokens = 4
	// MACLen is the length of a control-frame MAC (HMAC-SHA256).
	MACLen = sha256.Size
	// DefaultOverlap is how long a token dropped by a reload stays accepted
	// (the daemon's --auth-token-overlap default).
	DefaultOverlap = 5 * time.Minute
	// DefaultPromoteDelay is how long after a reload that changes the first
	// token of the file the previous token is still used to sign (the
	// daemon's --auth-token-promote-delay default). Every daemon must reload
	// within min(PromoteDelay, Overlap) of the first one.
	DefaultPromoteDelay = 2 * time.Minute
	// maxRetired is how many expired tokens are kept to name the
	// rejections they cause (mac_retired_token).
	maxRetired = 2
)

// Config configures a Keyring. Zero durations mean zero: the daemon's flags
// carry the defaults (DefaultOverlap, DefaultPromoteDelay).
type Config struct {
	// Path is the token file (--auth-token-file). Required by Open; New
	// takes the tokens directly and Reload then fails.
	Path string
	// Overlap is how long a token that a reload dropped from the file is
	// still accepted. Zero: dropped tokens are refused at once.
	Overlap time.Duration
	// PromoteDelay is how long after a reload that changes the file's first
	// token the previous one still signs; the new one is accepted at once.
	// Zero: the new token signs at once (use it with the two-step file
	// rotation, see the package doc).
	PromoteDelay time.Duration
	// Now is the clock (nil: time.Now).
	Now func() time.Time
	// Logger gets one line per load and per warning, and rate-limited
	// data-connection refusals (nil: none).
	Logger *zap.Logger
}

// Keyring holds the deployment's shared secrets: the token this daemon
// signs with and every token it accepts, each with its expiry. Its state is
// an immutable snapshot swapped atomically by Open, Reload and Rotate, so
// Seal, Verify and the challenge never take a lock. It is safe for
// concurrent use.
type Keyring struct {
	cfg  Config
	now  func() time.Time
	log  *zap.Logger
	ctr  counters
	lim  *loglimit.Limiter[Reason]
	mu   sync.Mutex // serialises Reload and Rotate
	ring atomic.Pointer[ring]
}

// secret is one token and the keys derived from it; immutable.
type secret struct {
	token []byte
	fp    string
	ctl   [2]macKey // by sending Side: ctl[0] prefill->decode, ctl[1] decode->prefill
	data  macKey
}

// entry is an accepted secret; a zero notAfter never expires.
type entry struct {
	s        *secret
	notAfter time.Time
}

// ring is one immutable snapshot of a Keyring.
type ring struct {
	file      []*secret // the tokens of the last load, in file order
	entries   []entry   // accepted: file tokens, then dropped ones until notAfter
	sign      *secret
	next      *secret // signs from promoteAt on
	promoteAt time.Time
	retired   []*secret // expired, newest first: only to name rejections
	warnings  []string
	loadedAt  time.Time
}

// signing returns the secret that signs at now.
func (r *ring) signing(now time.Time) *secret {
	if r.next != nil && !now.Before(r.promoteAt) {
		return r.next
	}
	return r.sign
}

func (e entry) live(now time.Time) bool { return e.notAfter.IsZero() || now.Before(e.notAfter) }

// find returns the first accepted secret (the signing one first) for which
// match is true, and whether it is the signing one; failing that it reports
// whether a retired or expired secret matches.
func (r *ring) find(now time.Time, match func(*secret) bool) (s *secret, current, retired bool) {
	sign := r.signing(now)
	if match(sign) {
		return sign, true, false
	}
	for _, e := range r.entries {
		if e.s != sign && e.live(now) && match(e.s) {
			return e.s, false, false
		}
	}
	for _, e := range r.entries {
		if e.s != sign && !e.live(now) && match(e.s) {
			return nil, false, true
		}
	}
	for _, s := range r.retired {
		if match(s) {
			return nil, false, true
		}
	}
	return nil, false, false
}

// macKey computes HMAC-SHA256 under one derived key. Keyed hashes are
// pooled: Reset restores the keyed state without hashing the key again.
type macKey struct{ pool *sync.Pool }

func newMACKey(key []byte) macKey {
	k := slices.Clone(key)
	return macKey{pool: &sync.Pool{New: func() any { return hmac.New(sha256.New, k) }}}
}

// sum appends HMAC(key, a || b || c) to dst.
func (m macKey) sum(dst, a, b, c []byte) []byte {
	h := m.pool.Get().(hash.Hash)
	h.Reset()
	h.Write(a)
	h.Write(b)
	h.Write(c)
	dst = h.Sum(dst)
	m.pool.Put(h)
	return dst
}

// Labels of the derived keys: a MAC or proof made for one purpose or
// direction is never valid for another.
const (
	labelCtlP2D = "pdlink/v1 control prefill->decode"
	labelCtlD2P = "pdlink/v1 control decode->prefill"
	labelData   = "pdlink/v1 data preface"
	labelFP     = "pdlink/v1 fingerprint"
)

func derive(token []byte, label string) []byte {
	h := hmac.New(sha256.New, token)
	h.Write([]byte(label))
	return h.Sum(nil)
}

func newSecret(token []byte) *secret {
	fp := derive(token, labelFP)
	return &secret{
		token: slices.Clone(token),
		fp:    hex.EncodeToString(fp[:4]),
		ctl:   [2]macKey{newMACKey(derive(token, labelCtlP2D)), newMACKey(derive(token, labelCtlD2P))},
		data:  newMACKey(derive(token, labelData)),
	}
}

// Open reads cfg.Path and returns a Keyring signing with its first token.
// A token file readable by every user is accepted with a warning (logged
// and in Status); see readTokenFile for what is refused.
func Open(cfg Config) (*Keyring, error) {
	if cfg.Path == "" {
		return nil, fmt.Errorf("%w: no path", ErrTokenFile)
	}
	tokens, warnings, err := readTokenFile(cfg.Path)
	if err != nil {
		return nil, err
	}
	k := newKeyring(cfg)
	k.apply(tokens, warnings)
	return k, nil
}

// New returns a Keyring over tokens given directly (tests, in-process
// harnesses); cfg.Path is ignored by Rotate and Reload refuses to run
// without it. Each token must be at least MinTokenLen bytes.
func New(cfg Config, tokens ...[]byte) (*Keyring, error) {
	if err := checkTokens(tokens); err != nil {
		return nil, err
	}
	k := newKeyring(cfg)
	k.apply(tokens, nil)
	return k, nil
}

func newKeyring(cfg Config) *Keyring {
	k := &Keyring{cfg: cfg, now: cfg.Now, log: cfg.Logger}
	if k.now == nil {
		k.now = time.Now
	}
	if k.log == nil {
		k.log = zap.NewNop()
	}
	k.lim = loglimit.New(numReasons, time.Second, k.now)
	return k
}

// Reload reads the token file again (the daemon calls it on SIGHUP). On
// error nothing changes: the tokens in force stay in force, and the error
// says why the file was refused. changed is false when the file holds the
// same tokens in the same order.
//
// When the file's first token differs from the one signing now, the new
// token is accepted at once and signs after PromoteDelay; the old one
// signs until then and is accepted for Overlap after it stops signing.
// Any other token missing from the file is accepted for Overlap more.
func (k *Keyring) Reload() (changed bool, err error) {
	if k.cfg.Path == "" {
		return false, fmt.Errorf("%w: keyring has no file to reload", ErrTokenFile)
	}
	tokens, warnings, err := readTokenFile(k.cfg.Path)
	if err != nil {
		k.ctr.reloadErrors.Add(1)
		k.log.Error("token file refused, keeping the tokens in force", zap.String("path", k.cfg.Path), zap.Error(err))
		return false, err
	}
	return k.apply(tokens, warnings), nil
}

// Rotate installs tokens as if a reload had read them from the file (first
// one to sign); for in-process tests and harnesses.
func (k *Keyring) Rotate(tokens ...[]byte) (changed bool, err error) {
	if err := checkTokens(tokens); err != nil {
		k.ctr.reloadErrors.Add(1)
		return false, err
	}
	return k.apply(tokens, nil), nil
}

// apply installs a new snapshot built from the file's tokens (already
// checked: 1..MaxTokens distinct tokens of at least MinTokenLen bytes).
func (k *Keyring) apply(tokens [][]byte, warnings []string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := k.now()
	old := k.ring.Load()
	for _, w := range warnings {
		k.log.Warn("token file", zap.String("path", k.cfg.Path), zap.String("warning", w))
	}
	if old != nil && sameTokens(old.file, tokens) {
		if !slices.Equal(old.warnings, warnings) {
			nr := *old
			nr.warnings = warnings
			k.ring.Store(&nr)
		}
		return false
	}
	known := func(t []byte) *secret {
		if old == nil {
			return nil
		}
		for _, e := range old.entries {
			if hmac.Equal(e.s.token, t) {
				return e.s
			}
		}
		for _, s := range old.retired {
			if hmac.Equal(s.token, t) {
				return s
			}
		}
		return nil
	}
	r := &ring{warnings: warnings, loadedAt: now}
	for _, t := range tokens {
		s := known(t)
		if s == nil {
			s = newSecret(t)
		}
		r.file = append(r.file, s)
		r.entries = append(r.entries, entry{s: s})
	}
	inFile := func(s *secret) bool { return slices.Contains(r.file, s) }
	first := r.file[0]
	if old == nil {
		r.sign = first
		k.ring.Store(r)
		k.log.Info("auth tokens loaded", zap.String("path", k.cfg.Path), zap.String("signing", first.fp), zap.Int("tokens", len(r.file)))
		return true
	}
	cur := old.signing(now)
	keepUntil := func(s *secret, t time.Time) {
		if !inFile(s) {
			r.entries = append(r.entries, entry{s: s, notAfter: t})
		}
	}
	switch {
	case cur == first:
		r.sign = first
	case k.cfg.PromoteDelay <= 0:
		r.sign = first
		keepUntil(cur, now.Add(k.cfg.Overlap))
	case old.next == first && now.Before(old.promoteAt):
		// The same rotation again (a second SIGHUP): keep its schedule.
		r.sign, r.next, r.promoteAt = cur, first, old.promoteAt
		keepUntil(cur, r.promoteAt.Add(k.cfg.Overlap))
	default:
		r.sign, r.next, r.promoteAt = cur, first, now.Add(k.cfg.PromoteDelay)
		keepUntil(cur, r.promoteAt.Add(k.cfg.Overlap))
	}
	for _, e := range old.entries {
		if inFile(e.s) || e.s == cur {
			continue
		}
		if !e.live(now) {
			r.retired = append(r.retired, e.s)
			continue
		}
		until := now.Add(k.cfg.Overlap)
		if !e.notAfter.IsZero() && e.notAfter.Before(until) {
			until = e.notAfter
		}
		if until.After(now) {
			r.entries = append(r.entries, entry{s: e.s, notAfter: until})
		} else {
			r.retired = append(r.retired, e.s)
		}
	}
	for _, s := range old.retired {
		if !inFile(s) && !slices.Contains(r.retired, s) && !slices.ContainsFunc(r.entries, func(e entry) bool { return e.s == s }) {
			r.retired = append(r.retired, s)
		}
	}
	if len(r.retired) > maxRetired {
		r.retired = r.retired[:maxRetired]
	}
	k.ring.Store(r)
	k.ctr.reloads.Add(1)
	fields := []zap.Field{zap.String("path", k.cfg.Path), zap.String("signing", r.sign.fp), zap.Int("accepted", len(r.entries))}
	if r.next != nil {
		fields = append(fields, zap.String("next", r.next.fp), zap.Time("promote_at", r.promoteAt))
	}
	k.log.Info("auth tokens reloaded", fields...)
	return true
}

func sameTokens(file []*secret, tokens [][]byte) bool {
	if len(file) != len(tokens) {
		return false
	}
	for i := range file {
		if !hmac.Equal(file[i].token, tokens[i]) {
			return false
		}
	}
	return true
}

// KeyStatus describes one accepted token.
type KeyStatus struct {
	// Fingerprint is 8 hex digits of a keyed hash of the token: equal on
	// two daemons iff they hold the same token; it reveals nothing of it.
	Fingerprint string
	// NotAfter is when the token stops being accepted; zero: never.
	NotAfter time.Time
}

// Status is a Keyring's state at one instant, for logs and debug pages.
type Status struct {
	// Signing is the fingerprint of the token that signs now; Next the one
	// that will sign from PromoteAt on ("" if none pending).
	Signing, Next string
	PromoteAt     time.Time
	// Accepted lists the tokens accepted now, the signing one first.
	Accepted []KeyStatus
	// Warnings are the last load's warnings (e.g. a world-readable file).
	Warnings []string
	LoadedAt time.Time
}

// Status returns the keyring's state now.
func (k *Keyring) Status() Status {
	now := k.now()
	r := k.ring.Load()
	sign := r.signing(now)
	st := Status{Signing: sign.fp, Warnings: slices.Clone(r.warnings), LoadedAt: r.loadedAt}
	if r.next != nil && sign != r.next {
		st.Next, st.PromoteAt = r.next.fp, r.promoteAt
	}
	for _, e := range r.entries {
		if e.s == sign {
			st.Accepted = append([]KeyStatus{{Fingerprint: e.s.fp, NotAfter: e.notAfter}}, st.Accepted...)
		} else if e.live(now) {
			st.Accepted = append(st.Accepted, KeyStatus{Fingerprint: e.s.fp, NotAfter: e.notAfter})
		}
	}
	return st
}

// Fingerprint returns the fingerprint of the token that signs now.
func (k *Keyring) Fingerprint() string { return k.ring.Load().signing(k.now()).fp }

// Stats returns a snapshot of the counters of every authenticator made
// from this Keyring.
func (k *Keyring) Stats() Stats { return k.ctr.snapshot() }
