package conn

import (
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/pdlink/pdlink/pkg/poll"
)

// RoomField is a room's key as log fields, inline: room (the id, a
// number, in every line about a room on both daemons, so one query finds
// them) and nonce once known. transfer.Key logs the same fields and its
// rank.
func RoomField(k poll.Key) zap.Field { return zap.Inline(roomKey(k)) }

type roomKey poll.Key

// MarshalLogObject implements zapcore.ObjectMarshaler.
func (k roomKey) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	enc.AddUint64("room", uint64(k.Room))
	if k.Nonce != 0 {
		enc.AddUint64("nonce", uint64(k.Nonce))
	}
	return nil
}
