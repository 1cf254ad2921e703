package conn

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/pdlink/pdlink/pkg/poll"
)

// Config is what both nodes share. Zero fields take the DefaultConfig
// values; Transport is required.
type Config struct {
	// Instance is this process's random id ("" draws one). Epoch is the
	// start time in unix nanoseconds (0: the clock's now).
	Instance string
	Epoch    uint64
	// Transport moves frames: zmtp in the daemons, MemNetwork.Host in tests.
	Transport Transport
	Clock     Clock
	Logger    *zap.Logger
	// Table configures the room table; its Side is set by the node. A zero
	// Table takes poll.DefaultConfig.
	Table  poll.Config
	Auth   Authenticator
	Limits Limits
	// TickInterval drives the table's deadlines, retransmits and
	// heartbeats; it adds to every deadline bound.
	TickInterval time.Duration
	// HeartbeatInterval and HeartbeatMisses: a peer unheard for
	// HeartbeatMisses*HeartbeatInterval is lost (peer_lost).
	HeartbeatInterval time.Duration
	HeartbeatMisses   int
	// RetryBase and RetryMax bound the retransmit backoff.
	RetryBase, RetryMax time.Duration
	// NotifyHorizon is how long an ABORT, STATUS or ABORT_ACK about a room
	// that ended here is retried (the peer's room has deadlines too).
	NotifyHorizon time.Duration
	// DedupeWindow is how many answered seqs are remembered per peer.
	DedupeWindow int
	// MaxPeers bounds registered decode peers (prefill side).
	MaxPeers int
	// PeerForgetAfter: a lost peer is forgotten after this long.
	PeerForgetAfter time.Duration
	// SubscriberBuffer is the default Subscribe buffer.
	SubscriberBuffer int
	// MaxUnansweredFrames and MaxUnansweredBytes bound the room frames
	// handed to the room owner and not yet answered (AckToken), by count
	// and by encoded size; past either a reader drops a room frame
	// unanswered and counts it (RejectOwnerBusy): the peer retransmits.
	MaxUnansweredFrames int
	MaxUnansweredBytes  int
	// Seed seeds the retransmit jitter (0: random).
	Seed uint64

	// FrameHook (tests: fault injection) runs before each received frame is
	// handled, on the worker that read it.
	FrameHook func(FrameType)
}

// DefaultConfig returns the defaults for every zero field.
func DefaultConfig() Config {
	return Config{
		TickInterval:      50 * time.Millisecond,
		HeartbeatInterval: time.Second,
		HeartbeatMisses:   3,
		RetryBase:         100 * time.Millisecond,
		RetryMax:          2 * time.Second,
		NotifyHorizon:     time.Minute,
		DedupeWindow:      4096,
		MaxPeers:          1024,
		PeerForgetAfter:   10 * time.Minute,
		SubscriberBuffer:  1024,
		// A METADATA is a few KiB, so the count bounds the common case;
		// the bytes bound a peer sending frames near MaxFrameSize.
		MaxUnansweredFrames: 4096,
		MaxUnansweredBytes:  64 << 20,
	}
}

func (c Config) withDefaults(side poll.Side) (Config, error) {
	d := DefaultConfig()
	if c.Transport == nil {
		return c, fmt.Errorf("%w: Config.Transport is nil", ErrBadArgument)
	}
	if c.Clock == nil {
		c.Clock = RealClock{}
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.Auth == nil {
		c.Auth = NoAuth{}
	}
	if c.Table == (poll.Config{}) {
		c.Table = poll.DefaultConfig(side)
	}
	c.Table.Side = side
	if err := c.Table.Validate(); err != nil {
		return c, err
	}
	c.Limits = c.Limits.withDefaults()
	setDur := func(p *time.Duration, v time.Duration) {
		if *p <= 0 {
			*p = v
		}
	}
	setDur(&c.TickInterval, d.TickInterval)
	setDur(&c.HeartbeatInterval, d.HeartbeatInterval)
	setDur(&c.RetryBase, d.RetryBase)
	setDur(&c.RetryMax, d.RetryMax)
	setDur(&c.NotifyHorizon, d.NotifyHorizon)
	setDur(&c.PeerForgetAfter, d.PeerForgetAfter)
	setInt := func(p *int, v int) {
		if *p <= 0 {
			*p = v
		}
	}
	setInt(&c.HeartbeatMisses, d.HeartbeatMisses)
	setInt(&c.DedupeWindow, d.DedupeWindow)
	setInt(&c.MaxPeers, d.MaxPeers)
	setInt(&c.SubscriberBuffer, d.SubscriberBuffer)
	setInt(&c.MaxUnansweredFrames, d.MaxUnansweredFrames)
	setInt(&c.MaxUnansweredBytes, d.MaxUnansweredBytes)
	if c.RetryMax < c.RetryBase {
		c.RetryMax = c.RetryBase
	}
	if c.Instance == "" {
		c.Instance = randomInstance()
	}
	if c.Epoch == 0 {
		c.Epoch = uint64(c.Clock.Now().UnixNano())
	}
	if c.Seed == 0 {
		c.Seed = randomUint64()
	}
	return c, nil
}

func randomInstance() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// randomUint64 draws a non-zero random number (crypto/rand).
func randomUint64() uint64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:])
		if v := binary.LittleEndian.Uint64(b[:]); v != 0 {
			return v
		}
	}
}
