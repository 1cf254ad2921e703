package transfer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"go.uber.org/zap/zapcore"
)

// Rank names one tensor-parallel rank of an engine: rank TP of Size (the proto's Rank,
// tp_rank and tp_size). The zero Rank is what a key of an engine without tensor
// parallelism may leave out: callers say {0, 1}.
type Rank struct {
	TP   uint16 `json:"tp_rank"`
	Size uint16 `json:"tp_size"`
}

// Key names one rank's share of a room on the data plane: the router's room id, the nonce
// decoded drew for it, and the rank. Two requests sharing a room id never touch each other's
// state, nor do two ranks of one room. Every data frame carries the whole key (wire v2).
type Key struct {
	Room  uint64
	Nonce uint64
	Rank  Rank
	// From is the prefill rank of a stream of head slices (Stream.Copies): a decode rank
	// fed by several prefill ranks (MHA 4 -> 2) takes one stream, and one Expectation, per
	// source rank. The zero Rank for whole pages, where a decode rank takes one stream.
	From Rank
}

// String is room/nonce, and the rank when the room has more than one: for errors and for a
// list of keys in one field (a refusal's expected streams). A line about the key logs it
// with zap.Inline, whose room field is the id alone (MarshalLogObject).
func (k Key) String() string {
	if k.From.Size > 0 {
		return fmt.Sprintf("%d/%d rank %d/%d from %d/%d", k.Room, k.Nonce, k.Rank.TP, k.Rank.Size, k.From.TP, k.From.Size)
	}
	if k.Rank.Size > 1 {
		return fmt.Sprintf("%d/%d rank %d/%d", k.Room, k.Nonce, k.Rank.TP, k.Rank.Size)
	}
	return fmt.Sprintf("%d/%d", k.Room, k.Nonce)
}

// MarshalLogObject logs a key as fields of the line (zap.Inline(key)): room, the id as a
// number, as every line about a room has it on both daemons (conn.RoomField); nonce; rank and,
// for a stream of head slices, from_rank, each as "tp/size".
func (k Key) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	enc.AddUint64("room", k.Room)
	enc.AddUint64("nonce", k.Nonce)
	if k.Rank.Size > 0 {
		enc.AddString("rank", fmt.Sprintf("%d/%d", k.Rank.TP, k.Rank.Size))
	}
	if k.From.Size > 0 {
		enc.AddString("from_rank", fmt.Sprintf("%d/%d", k.From.TP, k.From.Size))
	}
	return nil
}

// Reason is the closed set of failure reasons the data plane reports.
type Reason string

// Failure reasons.
const (
	ReasonChecksum      Reason = "checksum"       // a payload or aux row failed its crc32c
	ReasonTransferError Reason = "transfer_error" // the connection carrying the room broke or stalled
	ReasonInvalid       Reason = "invalid"        // pages, totals or sequence did not match the room's metadata
	// ReasonFenced: decode no longer takes the room's bytes (it ended the
	// room: abort, timeout, shutdown). Not a failure cause of its own: the
	// control plane carries decode's reason.
	ReasonFenced Reason = "fenced"
	// ReasonRegionReplaced: on the same-host path, decode found the prefill region file it
	// proved replaced at its path or removed (Mapping.Check) before copying a chunk. The
	// file is prefill's, so prefill's room takes this reason, as when prefill notices the
	// replacement itself (its RegisterRegion of the new file or its per-Send stat).
	ReasonRegionReplaced Reason = "region_replaced"
)

// AllReasons returns the closed set of failure reasons, in a stable order, so that every
// place that turns them into something else (wire codes, room reasons) can be tested over
// all of them: a reason added here without a mapping there fails that test.
func AllReasons() []Reason {
	return []Reason{ReasonChecksum, ReasonTransferError, ReasonInvalid, ReasonFenced, ReasonRegionReplaced}
}

type reasonCode uint32

const (
	codeOK reasonCode = iota
	codeChecksum
	codeTransferError
	codeInvalid
	codeFenced
	codeRegionReplaced
	maxReasonCode = codeRegionReplaced
)

func (r Reason) code() reasonCode {
	switch r {
	case ReasonChecksum:
		return codeChecksum
	case ReasonTransferError:
		return codeTransferError
	case ReasonFenced:
		return codeFenced
	case ReasonRegionReplaced:
		return codeRegionReplaced
	default:
		return codeInvalid
	}
}

func reasonFromCode(c uint32) Reason {
	switch reasonCode(c) {
	case codeChecksum:
		return ReasonChecksum
	case codeTransferError:
		return ReasonTransferError
	case codeFenced:
		return ReasonFenced
	case codeRegionReplaced:
		return ReasonRegionReplaced
	default:
		return ReasonInvalid
	}
}

// Error is a room failure: a Reason from the closed set and the underlying cause.
type Error struct {
	Reason Reason
	Err    error
}

func (e *Error) Error() string { return string(e.Reason) + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

func fail(r Reason, err error) *Error { return &Error{Reason: r, Err: err} }

// ReasonOf returns the failure reason carried by err, or ReasonTransferError for any error
// that does not carry one.
func ReasonOf(err error) Reason {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return ReasonTransferError
}

// Checksum selects payload integrity checking (--checksum).
type Checksum string

// Checksum settings.
const (
	ChecksumCRC32C Checksum = "crc32c" // default: crc32c (Castagnoli, hardware accelerated) on every payload
	ChecksumNone   Checksum = "none"   // no payload checksum; headers and run lists are still checked
)

// ParseChecksum parses a --checksum flag value.
func ParseChecksum(s string) (Checksum, error) {
	switch Checksum(s) {
	case ChecksumCRC32C, "":
		return ChecksumCRC32C, nil
	case ChecksumNone:
		return ChecksumNone, nil
	}
	return "", fmt.Errorf("%w: checksum %q (want crc32c or none)", ErrBadConfig, s)
}

// Transport is the prefill side of the data plane: it moves a room's pages from a local
// source region into a peer's destination region. The TCP Sender implements it; a same-host
// shared-memory copy or an RDMA engine can implement it later without changes to the
// callers, which only see Send, Fence and the done callback.
type Transport interface {
	// AddPeer registers a decode peer and its region layout (from REGISTER). It fails with
	// ErrIncompatibleLayout if the layouts cannot exchange pages.
	AddPeer(addr string, layout Layout) error
	// RemovePeer forgets a peer; its rooms fail with transfer_error.
	RemovePeer(addr string)
	// Open registers a room's stream (its destination pages per buffer) and pins it to one
	// connection, so its chunks and DONE stay in order. Nothing is sent before Append. On a
	// nil return st.Done is called exactly once, unless Fence(st.Key) is called first.
	Open(st Stream) error
	// Append queues the stream's next pages without waiting: they go on the wire chunk by
	// chunk as the peer's in-flight budget admits them (after the stream's earlier pieces;
	// streams whose last piece is queued go first), continuing the stream's chunk sequence.
	// The Last piece carries the aux row and closes the stream: DONE follows its chunks, and
	// st.Admitted reports its admission. A fenced stream's queued pieces are dropped.
	Append(key Key, p Piece) error
	// WaitAdmitted waits until the stream's pieces appended so far are admitted into the
	// peer's budget (backpressure), ctx ends or the room is fenced (ErrFenced). The daemons
	// use Stream.Admitted instead, so that no caller waits inside the transport.
	WaitAdmitted(ctx context.Context, key Key) error
	// Send is Open, Append of every page as the last piece, and WaitAdmitted; on an error
	// nothing stays queued and req.Done will not run.
	Send(ctx context.Context, req SendRequest) error
	// Fence stops the room and returns at once: no worker starts reading its source pages
	// again and its Done callback will not run. done reports that no worker reads them now
	// (I9); otherwise the implementation's OnFenced callback reports the moment the last
	// one lets go, within its FenceGrace plus one write.
	Fence(key Key) (done bool)
	// FenceWait is Fence followed by the wait for the last worker to let go.
	FenceWait(key Key)
	Close() error
}

// Sink is the decode side of the data plane: it accepts bytes into the local region for
// rooms registered with Expect and reports through Events. The TCP Receiver implements it.
type Sink interface {
	// Expect registers a room's destination pages and aux row before its bytes may land.
	Expect(e Expectation) error
	// Fence ends the room and returns at once: no later byte is written for it (R7) and it
	// is forgotten. done reports that no write for it is in progress (I9); otherwise the
	// implementation's OnFenced callback reports the moment the last one ends, within its
	// FenceGrace plus one piece.
	Fence(key Key) (done bool)
	// FenceWait is Fence followed by the wait for the write in progress to end.
	FenceWait(key Key)
	// ServeConn serves one accepted data connection (authentication first) on its own
	// goroutine until it ends or the sink closes; after Close it closes c at once. A
	// same-host sink still takes chunk boundaries, checksums and DONE over it.
	ServeConn(c net.Conn)
	Close() error
}

// Events receives the receiver's per-room outcomes. Calls come from connection goroutines:
// they must not block, and they may call Fence. For a given room, Complete or Failed is
// called at most once and never both; no Progress follows it.
type Events interface {
	// Progress reports that a chunk of the room was written and verified.
	Progress(key Key, bytes int64)
	// Complete reports that every page of every buffer and the aux row of key's rank are in
	// place and verified (I8); key is the Expectation's, rank included. That rank's share
	// of the room takes no more bytes; another rank's share of the room is not touched.
	Complete(key Key)
	// Failed reports that the room failed; no further byte is written for it.
	Failed(key Key, reason Reason, err error)
}

// NopEvents ignores every event.
type NopEvents struct{}

func (NopEvents) Progress(Key, int64)       {}
func (NopEvents) Complete(Key)              {}
func (NopEvents) Failed(Key, Reason, error) {}

// Authenticator runs a connection preface before any frame is exchanged. A later issue adds
// an HMAC challenge-response; NoAuth accepts every connection. Either side may wrap the
// connection it returns. Implementations must honour ctx (set conn deadlines from it).
type Authenticator interface {
	Client(ctx context.Context, conn net.Conn) (net.Conn, error)
	Server(ctx context.Context, conn net.Conn) (net.Conn, error)
}

// NoAuth is the no-op Authenticator.
type NoAuth struct{}

// Client returns conn unchanged.
func (NoAuth) Client(_ context.Context, c net.Conn) (net.Conn, error) { return c, nil }

// Server returns conn unchanged.
func (NoAuth) Server(_ context.Context, c net.Conn) (net.Conn, error) { return c, nil }

// Dialer opens data connections; *net.Dialer satisfies it, and MemNetwork provides an
// in-memory one for tests.
type Dialer interface {
	DialContext(ctx context.Context, network, addr string) (net.Conn, error)
}

// deadlineFor scales a write deadline by size: base plus the time to move n bytes at
// minRate bytes per second.
func deadlineFor(base time.Duration, n int64, minRate int64) time.Time {
	return time.Now().Add(base + time.Duration(n*int64(time.Second)/max(minRate, 1)))
}
