package zmtp

import (
	"errors"
	"fmt"
	"time"

	"github.com/go-zeromq/zmq4"
	"go.uber.org/zap"
)

// errReaderExit is returned by serveSocket when zmq4's Recv failed while
// the socket was not being closed.
var errReaderExit = errors.New("zmtp: socket reader exited")

// deliverFunc validates one received message and hands it to the
// socket's receive queue; it returns false when stop was closed first.
type deliverFunc func(msg zmq4.Msg, stop <-chan struct{}) bool

// serveSocket runs one zmq4 socket until quit is closed (nil) or the socket
// must be re-created (the reader's error, or errPanic). The calling
// goroutine is the socket's owner: it alone sends and closes. One reader
// goroutine, started here and always joined before return, alone calls
// Recv. A panic in either is recovered and reported as errPanic; the
// socket is closed and drained on every exit path. held goes out first:
// frames sent while the socket was connecting.
func (t *Transport) serveSocket(sock zmq4.Socket, held []zmq4.Msg, quit <-chan struct{}, sendq <-chan zmq4.Msg, deliver deliverFunc) (err error) {
	stop := make(chan struct{})
	readerDone := make(chan error, 1)
	go t.readLoop(sock, stop, readerDone, deliver)
	joined := false
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: owner: %v", errPanic, r)
		}
		_ = sock.Close()
		close(stop)
		if !joined {
			<-readerDone
		}
		drain(sock)
	}()
	for _, msg := range held {
		t.send(sock, msg)
	}
	for {
		select {
		case <-quit:
			return nil
		case rerr := <-readerDone:
			joined = true
			if rerr == nil {
				rerr = errReaderExit
			}
			return rerr
		case msg := <-sendq:
			t.send(sock, msg)
		}
	}
}

func (t *Transport) send(sock zmq4.Socket, msg zmq4.Msg) {
	if err := sock.Send(msg); err != nil {
		t.ctr.drop(DropSendError)
		t.log.Debug("send failed", zap.Error(err))
	}
}

// readLoop is the socket's only Recv caller. It sends exactly one value on
// done: the Recv error, nil when stop closed, or errPanic.
func (t *Transport) readLoop(sock zmq4.Socket, stop <-chan struct{}, done chan<- error, deliver deliverFunc) {
	defer func() {
		if r := recover(); r != nil {
			done <- fmt.Errorf("%w: reader: %v", errPanic, r)
		}
	}()
	for {
		msg, err := sock.Recv()
		if err != nil {
			done <- err
			return
		}
		if h := t.testHookRecv.Load(); h != nil {
			(*h)()
		}
		if msg.Type == zmq4.CmdMsg {
			t.ctr.drop(DropCommand)
			continue
		}
		if !deliver(msg, stop) {
			done <- nil
			return
		}
	}
}

// sleepDropping waits d, dropping (and counting) frames queued while there
// is no socket. It returns false if quit closed first.
func (t *Transport) sleepDropping(d time.Duration, quit <-chan struct{}, sendq <-chan zmq4.Msg) bool {
	tm := time.NewTimer(d)
	defer tm.Stop()
	for {
		select {
		case <-quit:
			return false
		case <-tm.C:
			return true
		case <-sendq:
			t.ctr.drop(DropDisconnected)
		}
	}
}
