// Package auth is pdlink's shared-secret authentication between daemons
// (issue 9): a Keyring of tokens read from --auth-token-file, the HMAC that
// every control envelope carries (Control, pkg/conn's Authenticator), the
// mutual challenge-response that opens every data connection (Data,
// pkg/transfer's Authenticator), and CheckListen, the rule that a daemon
// without a secret listens on loopback only unless told --insecure.
//
// # Keys
//
// A token is at least 32 bytes (MinTokenLen) of a file, one per line, the
// first one signing. It is never used directly: HMAC-SHA256(token, label)
// derives one key per purpose and direction (control prefill->decode,
// control decode->prefill, data preface), so a MAC made for one never
// verifies as another, and a control frame reflected back to its sender
// fails. The fingerprint (8 hex digits of another derived value) names a
// token in logs and Status without revealing it.
//
// # Control plane
//
// Control.Seal returns HMAC-SHA256 over the envelope serialised with mac
// empty, which covers its sender instance, epoch, seq and body; Verify
// checks it in constant time against every token accepted now (the
// signing one first). pkg/conn's Codec calls both and counts a failure as
// frames_rejected_total{reason="auth"}; this package counts the finer
// reason (mac_missing, mac_malformed, mac_invalid, mac_retired_token) in
// Stats.
//
// The MAC makes frames unforgeable and binds seq and epoch, so a captured
// frame cannot be re-sent under a fresh seq (to escape dedupe) or a newer
// epoch (to fake a restart). A byte-identical replay still verifies: it is
// pkg/conn's dedupe window and each room's random nonce that make replays
// harmless there, and the MAC binds no recipient or connection (see the
// package tests for what is covered and the issue 9 report for the gaps).
//
// # Data plane
//
// Before any chunk, Data runs on each new connection:
//
//	client -> server  "PDLA" 1 Nc          (37 bytes, Nc: 32 random bytes)
//	server -> client  "PDLA" 1 Ns          (37 bytes, Ns: 32 random bytes)
//	client -> server  HMAC(Kd, client label | Nc | Ns)
//	server -> client  HMAC(Kd, server label | Nc | Ns)
//
// The client (prefill, which dials only endpoints from authenticated
// REGISTERs) proves first, so the listener, which anyone can reach,
// computes nothing for a peer that has not proven the secret. The server
// proves with the token that verified the client. Fresh nonces on both
// sides defeat replay; the labels defeat reflection; a server echoing the
// client's nonce is refused. A failure closes the connection and counts a
// challenge_* reason. The preface costs two round trips per connection and
// nothing per KV byte: connections are pooled.
//
// # Rotation
//
// Reload (on SIGHUP) reads the file again; a refused file changes nothing.
// A token no longer in the file stays accepted for Overlap. When the first
// token changes, the new one is accepted at once but the old one keeps
// signing for PromoteDelay, so daemons that reload one after the other
// never refuse each other's frames as long as every daemon reloads within
// min(PromoteDelay, Overlap) of the first (one-step rotation: write the new
// token, SIGHUP every daemon). For slower roll-outs, use the two-step
// rotation, which has no timing constraint on step 1: write "old\nnew"
// everywhere and SIGHUP (everyone accepts new, still signs old); then write
// "new" everywhere and SIGHUP within Overlap. A daemon restarted mid
// rotation signs with its file's first token at once. Data connections
// already open stay open across a rotation: the preface proves the secret
// once per connection.
//
// # Threat model
//
// Protected, for an attacker who can reach the bootstrap and data ports and
// read traffic but does not hold a token: registering a fake decode peer
// (and so receiving KV pages), aborting or completing other peers' rooms,
// forging any control frame, re-sending a captured frame under another
// seq, epoch or sender, and writing pages over a data connection.
//
// Not protected: confidentiality. KV bytes (which encode users' prompts)
// and control frames cross the network in clear; anyone on the path can
// read them. Nor is the integrity of KV bytes after the preface (only
// crc32c) against an attacker on the path who can inject into or relay an
// established TCP connection; nor denial of service (dropping, resetting,
// flooding). Use a private network, or a tunnel (WireGuard, IPsec, a
// service mesh with mTLS) when the path is not trusted. A token holder is
// trusted: every daemon of a deployment holds the same secret.
//
// # Goroutines and ownership
//
// The package starts no goroutine. Keyring's state is an immutable
// snapshot behind an atomic pointer: Seal, Verify, Client and Server read
// it without a lock from any goroutine; Reload and Rotate build a new one
// under a mutex. Client and Server run on the caller's goroutine; while
// they run, a context.AfterFunc set on the caller's ctx may set the
// connection's deadline (cancellation), and it is stopped before they
// return. Counters are atomics.
//
// # Usage
//
// The daemon (prefilld or decoded):
//
//  1. Validate the listen flags with CheckListen(haveSecret, insecure, eps...)
//     before binding anything; refuse to start on its error.
//  2. With --auth-token-file, Open(Config{Path, Overlap, PromoteDelay,
//     Logger}); refuse to start on error. Log Status().Warnings.
//  3. Set conn.Config.Auth = kr.Control(SidePrefill) (prefilld) or
//     kr.Control(SideDecode) (decoded).
//  4. Set transfer.SenderConfig.Auth (prefilld) and
//     transfer.ReceiverConfig.Auth (decoded) to kr.Data().
//  5. On SIGHUP call kr.Reload(); on error keep running (the tokens in force
//     stay) and log it.
//  6. Export kr.Stats() and Status() at scrape time: rejections per Reason
//     (AllReasons), verified-with-another-token counts, reloads.
package auth
