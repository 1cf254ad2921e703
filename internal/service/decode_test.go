package service

import (
	"errors"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/pdlink/pdlink/pkg/poll"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// A room's recorded SendMetadata lives until the room is forgotten (clear
// or reap), and a first call that failed is not kept: the scheduler may
// try again, and nothing is held for rooms that are gone.
func TestRecordedMetadataIsForgottenWithTheRoom(t *testing.T) {
	d := NewDecodeData(transfer.KindTCP, transfer.ReceiverConfig{}, zaptest.NewLogger(t))
	key := poll.Key{Room: 1, Nonce: 2}
	claim := func() bool {
		_, first := d.claimMetadata(key, &sentMetadata{done: make(chan struct{})})
		return first
	}
	md := &sentMetadata{done: make(chan struct{})}
	if _, first := d.claimMetadata(key, md); !first {
		t.Fatal("first call not taken as first")
	}
	d.settleMetadata(key, md, errors.New("refused"))
	if !claim() {
		t.Fatal("a failed first call is still recorded")
	}
	if claim() {
		t.Fatal("a second call is taken as first")
	}
	d.Forget(key)
	if n := len(d.metadata); n != 0 {
		t.Fatalf("%d rooms' metadata kept after Forget", n)
	}
}
