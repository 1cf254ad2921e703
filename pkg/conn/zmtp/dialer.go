package zmtp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"go.uber.org/zap"

	"github.com/pdlink/pdlink/pkg/conn"
)

// dialer is a conn.Conn over one DEALER socket connected to exactly one
// endpoint. Its owner goroutine (run) owns the reconnect loop: dial with
// a deadline, serve until the peer goes away (zmq4 reports io.EOF) or a
// goroutine panics, close the socket, back off with jitter, dial a fresh
// DEALER with the same identity (so the Listener sees the same Route).
type dialer struct {
	t     *Transport
	ep    string
	id    string
	sendq chan zmq4.Msg
	recvq chan []byte
	quit  chan struct{}
	done  chan struct{}
	once  sync.Once
}

var _ conn.Conn = (*dialer)(nil)

func (t *Transport) startDialer(ep string) *dialer {
	d := &dialer{
		t:     t,
		ep:    ep,
		id:    newIdentity(),
		sendq: make(chan zmq4.Msg, t.opts.SendQueue),
		recvq: make(chan []byte, t.opts.RecvQueue),
		quit:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	go d.run()
	return d
}

func (d *dialer) run() {
	defer close(d.done)
	log := d.t.log.With(zap.String("endpoint", d.ep), zap.String("identity", d.id))
	attempt := 0
	for {
		sock, held, cancel, err := d.connect()
		if err != nil {
			attempt++
			log.Debug("connect failed", zap.Int("attempt", attempt), zap.Error(err))
			if !d.t.sleepDropping(d.t.backoff(attempt), d.quit, d.sendq) {
				return
			}
			continue
		}
		if sock == nil {
			return // closing
		}
		log.Info("connected")
		began := time.Now()
		err = d.t.serveSocket(sock, held, d.quit, d.sendq, d.deliver)
		cancel()
		if err == nil {
			return
		}
		if errors.Is(err, errPanic) {
			d.t.ctr.restarts.Add(1)
			log.Warn("conn socket restarting", zap.Error(err))
		} else {
			log.Info("peer lost", zap.Error(err))
		}
		d.t.ctr.reconnects.Add(1)
		if time.Since(began) > healthyAfter {
			attempt = 0
		}
		attempt++
		if !d.t.sleepDropping(d.t.backoff(attempt), d.quit, d.sendq) {
			return
		}
	}
}

// connect dials a fresh DEALER in a helper goroutine. Frames sent
// meanwhile are held, in order, up to the send queue's size, and go out
// first once connected: a Conn's first frames (decode's REGISTER and the
// first room's METADATA, sent right after Dial) arrive in the order they
// were sent instead of the REGISTER being dropped and the METADATA
// refused as from an unknown peer. Held frames of a failed attempt, and
// any past the limit, are dropped and counted (Send never blocks on a
// connect). It returns a nil socket if the Conn is closing; closing
// cancels the dial's context, which aborts the TCP connect and closes a
// connection stuck in its handshake.
func (d *dialer) connect() (zmq4.Socket, []zmq4.Msg, context.CancelFunc, error) {
	ctx, cancel := context.WithCancel(d.t.base)
	type result struct {
		sock zmq4.Socket
		err  error
	}
	res := make(chan result, 1)
	var held []zmq4.Msg
	go func() {
		sock := zmq4.NewDealer(ctx, d.t.sockOpts(zmq4.WithID(zmq4.SocketIdentity(d.id)))...)
		// zmq4 runs the client handshake in this goroutine: a panic in it
		// (the guard should make that impossible) is ours to recover.
		defer func() {
			if r := recover(); r != nil {
				_ = sock.Close()
				d.t.ctr.restarts.Add(1)
				res <- result{err: fmt.Errorf("%w: dial: %v", errPanic, r)}
			}
		}()
		if err := sock.Dial(d.ep); err != nil {
			_ = sock.Close()
			res <- result{err: err}
			return
		}
		res <- result{sock: sock}
	}()
	for {
		select {
		case r := <-res:
			if r.err != nil {
				cancel()
				d.t.ctr.dropN(DropDisconnected, len(held))
				return nil, nil, nil, r.err
			}
			return r.sock, held, cancel, nil
		case msg := <-d.sendq:
			if len(held) < cap(d.sendq) {
				held = append(held, msg)
			} else {
				d.t.ctr.drop(DropDisconnected)
			}
		case <-d.quit:
			cancel()
			if r := <-res; r.sock != nil {
				_ = r.sock.Close()
				drain(r.sock)
			}
			return nil, nil, nil, nil
		}
	}
}

// deliver accepts single-frame messages only.
func (d *dialer) deliver(msg zmq4.Msg, stop <-chan struct{}) bool {
	if len(msg.Frames) != 1 {
		d.t.ctr.drop(DropBadParts)
		return true
	}
	if len(msg.Frames[0]) > conn.MaxFrameSize {
		d.t.ctr.drop(DropOversize)
		return true
	}
	select {
	case d.recvq <- msg.Frames[0]:
		return true
	case <-stop:
		return false
	}
}

// Recv returns the next frame from the Listener.
func (d *dialer) Recv(ctx context.Context) ([]byte, error) {
	select {
	case <-d.quit:
		return nil, conn.ErrClosed
	default:
	}
	select {
	case f := <-d.recvq:
		return f, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-d.quit:
		return nil, conn.ErrClosed
	}
}

// Send queues frame (copied). Frames queued while a connection attempt is
// in progress go out once it succeeds (up to the send queue's size);
// those queued while the Conn backs off after a failed attempt are
// dropped and counted (DropDisconnected).
func (d *dialer) Send(ctx context.Context, frame []byte) error {
	if len(frame) > conn.MaxFrameSize {
		return ErrFrameTooLarge
	}
	return enqueue(ctx, d.quit, d.sendq, zmq4.NewMsg(append([]byte(nil), frame...)))
}

// Close stops the owner goroutine and waits for every goroutine of this
// Conn to exit.
func (d *dialer) Close() error {
	d.once.Do(func() {
		close(d.quit)
		<-d.done
	})
	return nil
}
