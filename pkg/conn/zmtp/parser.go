package zmtp

import (
	"encoding/binary"
	"fmt"
)

// Rejection reasons counted by the guard (Stats.Rejected, Options.OnReject).
const (
	// ReasonBadGreeting: the 64-byte greeting has a wrong signature, a
	// version other than 3.x, a mechanism other than NULL or a bad
	// as-server byte.
	ReasonBadGreeting = "bad_greeting"
	// ReasonBadFlags: a frame flags byte with reserved bits set, or a
	// command frame flagged MORE or sent inside a multipart message.
	ReasonBadFlags = "bad_flags"
	// ReasonFrameTooLarge: a frame (or a multipart message) whose declared
	// size is over the limit; the body is never read.
	ReasonFrameTooLarge = "frame_too_large"
	// ReasonBadCommand: a command whose name or READY properties do not fit
	// in its body, a READY without a known Socket-Type, an unknown
	// command, or a malformed ERROR/PING/PONG.
	ReasonBadCommand = "bad_command"
	// ReasonBadHandshake: the first frame after the greeting is not a
	// READY command, or the peer's Socket-Type is not the one expected
	// (DEALER at a Listener, ROUTER at a Conn).
	ReasonBadHandshake = "bad_handshake"
	// ReasonTooManyParts: a multipart message with more frames than allowed.
	ReasonTooManyParts = "too_many_parts"
	// ReasonHandshakeTimeout: greeting+READY not received in time.
	ReasonHandshakeTimeout = "handshake_timeout"
	// ReasonHandshakeIncomplete: the peer closed before finishing the
	// handshake.
	ReasonHandshakeIncomplete = "handshake_incomplete"
	// ReasonHandshakeOverload: too many connections were in their
	// handshake at once; the new one was closed at accept.
	ReasonHandshakeOverload = "handshake_overload"
	// ReasonPeerRefused: the peer address is outside Options.AllowedNetworks.
	ReasonPeerRefused = "peer_refused"
	// ReasonWriteStall: a write did not complete within
	// Options.WriteTimeout; the connection was closed.
	ReasonWriteStall = "write_stall"
)

// rejectReasons lists every reason, for the counters.
var rejectReasons = []string{
	ReasonBadGreeting, ReasonBadFlags, ReasonFrameTooLarge, ReasonBadCommand,
	ReasonBadHandshake, ReasonTooManyParts, ReasonHandshakeTimeout,
	ReasonHandshakeIncomplete, ReasonHandshakeOverload, ReasonPeerRefused,
	ReasonWriteStall,
}

const (
	greetingLen = 64

	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04
	flagKnown   = flagMore | flagLong | flagCommand

	// maxPingBody is TTL (2 bytes) plus a context of up to 16 bytes.
	maxPingBody = 2 + 16
	maxPongBody = 16
)

// nullMechanism is the mechanism field of a NULL greeting.
var nullMechanism = [20]byte{'N', 'U', 'L', 'L'}

// serverGreeting is the greeting zmq4 v0.17.0 writes (version 3.0, NULL,
// as-server 0). The guard sends it itself during the pre-handshake and
// swallows the identical 64 bytes the library writes later.
var serverGreeting = func() (g [greetingLen]byte) {
	g[0], g[9], g[10], g[11] = 0xFF, 0x7F, 3, 0
	copy(g[12:32], nullMechanism[:])
	return g
}()

// limits bound what a peer may send.
type limits struct {
	maxFrame   uint64 // message frame body and multipart message total
	maxCommand uint64 // command frame body
	maxParts   int    // frames per multipart message
	// peerType, if set, is the only Socket-Type accepted from the peer.
	// zmq4 leaves a connection open (fd leak) when the handshake fails on
	// an incompatible type, so the guard refuses it first.
	peerType string
}

// phase is where the parser stands in the ZMTP stream.
type phase uint8

const (
	phGreeting     phase = iota
	phFlags              // next byte is a frame's flags
	phSize               // collecting the 1- or 8-byte size
	phSkip               // skipping p.skip bytes of the body, then p.next
	phCmdNameLen         // command body: name length
	phCmdName            // command body: name
	phPropNameLen        // READY: property name length
	phPropName           // READY: property name
	phPropValLen         // READY: 4-byte value length
	phTypeVal            // READY: the Socket-Type value
	phErrReasonLen       // ERROR: reason length
)

// command names the parser knows; anything else is bad_command.
const (
	cmdReady = "READY"
	cmdError = "ERROR"
	cmdPing  = "PING"
	cmdPong  = "PONG"
)

// parser is an incremental ZMTP 3.x validator. It sees every byte a peer
// sends, in any chunking, and returns a *violation at the first byte that
// makes the stream unsafe for zmq4 v0.17.0 to parse. It never allocates on
// the accept path.
type parser struct {
	lim limits

	ph      phase
	next    phase  // phase after a skip
	skip    uint64 // bytes left to skip
	n       int    // bytes collected in the current fixed-size field
	field   [8]byte
	name    [255]byte
	nameLen int
	cmd     string // known command being parsed, "" for a message frame

	flags    byte
	sizeLen  int
	remain   uint64 // bytes left in the current frame body
	msgBytes uint64 // bytes so far in the current multipart message
	parts    int    // frames so far in the current multipart message
	ready    bool   // a complete READY has been seen
	isType   bool   // the current READY property is Socket-Type
	sawType  bool   // the current READY had a valid Socket-Type
	valLen   int
}

func newParser(lim limits) *parser { return &parser{lim: lim} }

// handshakeDone reports whether the peer's greeting and READY were seen.
func (p *parser) handshakeDone() bool { return p.ready }

func reject(reason, format string, args ...any) *violation {
	return &violation{reason: reason, detail: fmt.Sprintf(format, args...)}
}

// feed validates b, the next bytes of the stream. After a violation the
// parser must not be fed again.
func (p *parser) feed(b []byte) *violation {
	for len(b) > 0 {
		if p.ph == phSkip {
			k := min(p.skip, uint64(len(b)))
			b = b[k:]
			p.skip -= k
			p.remain -= k
			if p.skip == 0 {
				if v := p.endSkip(); v != nil {
					return v
				}
			}
			continue
		}
		c := b[0]
		b = b[1:]
		var v *violation
		switch p.ph {
		case phGreeting:
			v = p.greetingByte(c)
		case phFlags:
			v = p.flagsByte(c)
		case phSize:
			v = p.sizeByte(c)
		default:
			p.remain--
			v = p.commandByte(c)
		}
		if v != nil {
			return v
		}
	}
	return nil
}

func (p *parser) greetingByte(c byte) *violation {
	i := p.n
	switch {
	case i == 0 && c != 0xFF, i == 9 && c != 0x7F:
		return reject(ReasonBadGreeting, "signature byte %d is %#x", i, c)
	case i == 10 && c != 3:
		return reject(ReasonBadGreeting, "major version %d, want 3", c)
	case i >= 12 && i < 32 && c != nullMechanism[i-12]:
		return reject(ReasonBadGreeting, "mechanism is not NULL")
	case i == 32 && c != 0:
		return reject(ReasonBadGreeting, "as-server %#x with NULL mechanism", c)
	}
	p.n++
	if p.n == greetingLen {
		p.ph, p.n = phFlags, 0
	}
	return nil
}

func (p *parser) flagsByte(c byte) *violation {
	if c&^flagKnown != 0 {
		return reject(ReasonBadFlags, "reserved flag bits %#x", c)
	}
	cmd := c&flagCommand != 0
	if !p.ready && !cmd {
		return reject(ReasonBadHandshake, "message frame before READY")
	}
	if cmd && (c&flagMore != 0 || p.parts > 0) {
		return reject(ReasonBadFlags, "command frame inside a multipart message")
	}
	p.flags, p.n, p.ph = c, 0, phSize
	p.sizeLen = 1
	if c&flagLong != 0 {
		p.sizeLen = 8
	}
	return nil
}

func (p *parser) sizeByte(c byte) *violation {
	p.field[p.n] = c
	p.n++
	if p.n < p.sizeLen {
		return nil
	}
	size := uint64(c)
	if p.sizeLen == 8 {
		size = binary.BigEndian.Uint64(p.field[:])
	}
	p.remain, p.n = size, 0
	if p.flags&flagCommand != 0 {
		switch {
		case size > p.lim.maxCommand:
			return reject(ReasonFrameTooLarge, "command of %d bytes, limit %d", size, p.lim.maxCommand)
		case size == 0:
			return reject(ReasonBadCommand, "empty command")
		}
		p.ph = phCmdNameLen
		return nil
	}
	if size > p.lim.maxFrame || p.msgBytes+size > p.lim.maxFrame {
		return reject(ReasonFrameTooLarge, "frame of %d bytes (message %d), limit %d",
			size, p.msgBytes+size, p.lim.maxFrame)
	}
	p.parts++
	if p.parts > p.lim.maxParts {
		return reject(ReasonTooManyParts, "more than %d frames in a message", p.lim.maxParts)
	}
	p.msgBytes += size
	p.cmd = ""
	return p.skipThen(size, phFlags)
}

// skipThen skips k body bytes (k may be 0) and then moves to next, or ends
// the frame when the body is exhausted.
func (p *parser) skipThen(k uint64, next phase) *violation {
	p.skip, p.next = k, next
	if k == 0 {
		return p.endSkip()
	}
	p.ph = phSkip
	return nil
}

func (p *parser) endSkip() *violation {
	if p.remain == 0 {
		return p.frameDone()
	}
	p.ph = p.next
	return nil
}

func (p *parser) frameDone() *violation {
	switch {
	case p.cmd == cmdReady:
		if !p.sawType {
			// zmq4 panics on a peer socket type it does not know.
			return reject(ReasonBadCommand, "READY without a valid Socket-Type")
		}
		p.ready = true
	case p.cmd == "" && p.flags&flagMore == 0:
		p.parts, p.msgBytes = 0, 0
	}
	p.cmd, p.ph = "", phFlags
	return nil
}

// commandByte consumes one byte of a command body (p.remain already counts
// it as consumed).
func (p *parser) commandByte(c byte) *violation {
	switch p.ph {
	case phCmdNameLen:
		if c == 0 || uint64(c) > p.remain {
			return reject(ReasonBadCommand, "command name length %d overruns body", c)
		}
		p.nameLen, p.n, p.ph = int(c), 0, phCmdName
	case phCmdName:
		p.name[p.n] = c
		p.n++
		if p.n == p.nameLen {
			p.n = 0
			return p.startCommand()
		}
	case phPropNameLen:
		if c == 0 || uint64(c)+4 > p.remain {
			return reject(ReasonBadCommand, "READY property name (%d) and value length overrun body", c)
		}
		p.nameLen, p.n, p.ph = int(c), 0, phPropName
	case phPropName:
		if !isNameChar(c) {
			return reject(ReasonBadCommand, "READY property name byte %#x", c)
		}
		p.name[p.n] = c
		p.n++
		if p.n == p.nameLen {
			p.n, p.ph = 0, phPropValLen
			return p.checkPropName()
		}
	case phPropValLen:
		p.field[p.n] = c
		p.n++
		if p.n == 4 {
			p.n = 0
			v := uint64(binary.BigEndian.Uint32(p.field[:4]))
			if v > p.remain {
				return reject(ReasonBadCommand, "READY property value of %d bytes overruns body", v)
			}
			if !p.isType {
				return p.skipThen(v, phPropNameLen)
			}
			if v == 0 || v > maxSocketType {
				return reject(ReasonBadCommand, "Socket-Type value of %d bytes", v)
			}
			p.valLen, p.ph = int(v), phTypeVal
		}
	case phTypeVal:
		p.field[p.n] = c
		p.n++
		if p.n == p.valLen {
			p.n = 0
			v := p.field[:p.valLen]
			if !knownSocketType(v) {
				return reject(ReasonBadCommand, "unknown Socket-Type %q", v)
			}
			if p.lim.peerType != "" && string(v) != p.lim.peerType {
				return reject(ReasonBadHandshake, "peer Socket-Type %q, want %s", v, p.lim.peerType)
			}
			p.sawType = true
			return p.skipThen(0, phPropNameLen)
		}
	case phErrReasonLen:
		if uint64(c) != p.remain {
			return reject(ReasonBadCommand, "ERROR reason length %d, body has %d", c, p.remain)
		}
		return p.skipThen(p.remain, phFlags)
	}
	return nil
}

// maxSocketType is the longest socket type name ("DEALER", "ROUTER").
const maxSocketType = 6

// isNameChar is the ZMTP 3.0 property name alphabet: ALPHA, DIGIT, "-",
// "_", "." and "+". Keeping names ASCII makes zmq4's Unicode title-casing
// of names predictable.
func isNameChar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '_' || c == '.' || c == '+'
}

// checkPropName flags a Socket-Type property. zmq4 title-cases names
// ("socket-type" becomes "Socket-Type") and then looks up "Socket-Type";
// a spelling that folds to socket-type but that zmq4 would not find (say
// "SOCKET-TYPE") could hide the real type from it, so it is refused.
func (p *parser) checkPropName() *violation {
	name := p.name[:p.nameLen]
	p.isType = false
	if len(name) != len("socket-type") || !asciiEqualFold(name, "socket-type") {
		return nil
	}
	if name[0]|0x20 != 's' || string(name[1:7]) != "ocket-" || name[7]|0x20 != 't' || string(name[8:]) != "ype" {
		return reject(ReasonBadCommand, "Socket-Type property spelt %q", name)
	}
	p.isType = true
	return nil
}

func asciiEqualFold(b []byte, s string) bool {
	for i := range b {
		if b[i]|0x20 != s[i]|0x20 {
			return false
		}
	}
	return true
}

// knownSocketType reports whether zmq4's SocketType.IsCompatible accepts
// v as a receiver without panicking.
func knownSocketType(v []byte) bool {
	switch string(v) {
	case "PAIR", "PUB", "SUB", "REQ", "REP", "DEALER", "ROUTER", "PULL", "PUSH", "XPUB", "XSUB":
		return true
	}
	return false
}

func (p *parser) startCommand() *violation {
	name := p.name[:p.nameLen]
	switch string(name) { // no allocation: the compiler compares in place
	case cmdReady:
		p.cmd = cmdReady
	case cmdError:
		p.cmd = cmdError
	case cmdPing:
		p.cmd = cmdPing
	case cmdPong:
		p.cmd = cmdPong
	default:
		if !p.ready {
			return reject(ReasonBadHandshake, "first command is not READY")
		}
		return reject(ReasonBadCommand, "unknown command %q", name)
	}
	if !p.ready && p.cmd != cmdReady {
		return reject(ReasonBadHandshake, "first command is %s, not READY", p.cmd)
	}
	switch p.cmd {
	case cmdReady:
		if p.ready {
			return reject(ReasonBadCommand, "second READY")
		}
		p.sawType = false
		return p.skipThen(0, phPropNameLen)
	case cmdError:
		if p.remain == 0 {
			return reject(ReasonBadCommand, "ERROR without reason length")
		}
		p.ph = phErrReasonLen
	case cmdPing:
		if p.remain < 2 || p.remain > maxPingBody {
			return reject(ReasonBadCommand, "PING body of %d bytes", p.remain)
		}
		return p.skipThen(p.remain, phFlags)
	case cmdPong:
		if p.remain > maxPongBody {
			return reject(ReasonBadCommand, "PONG body of %d bytes", p.remain)
		}
		return p.skipThen(p.remain, phFlags)
	}
	return nil
}
