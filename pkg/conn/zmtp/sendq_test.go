package zmtp

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// The link sends with a ctx already done (conn.Transport): a frame must
// still be queued whenever there is room, every time, and a full queue
// must refuse at once rather than hold the room owner that sends.
func TestSendWithADoneContextQueuesWhenThereIsRoomAndNeverWaits(t *testing.T) {
	done, cancel := context.WithCancel(context.Background())
	cancel()
	quit := make(chan struct{})
	const slots = 64
	q := make(chan zmq4.Msg, slots)
	for i := range slots {
		if err := enqueue(done, quit, q, zmq4.NewMsg([]byte{byte(i)})); err != nil {
			t.Fatalf("frame %d refused with room in the queue: %v", i, err)
		}
	}
	refused := make(chan error, 1)
	go func() { refused <- enqueue(done, quit, q, zmq4.NewMsg([]byte("one too many"))) }()
	select {
	case err := <-refused:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("full queue answered %v, want the ctx's error", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a send with a done ctx waited on a full queue")
	}
	close(quit)
	if err := enqueue(done, quit, q, zmq4.NewMsg(nil)); err == nil {
		t.Fatal("a closed socket took a frame")
	}
}
