package zmtp

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"go.uber.org/zap"

	"github.com/pdlink/pdlink/pkg/conn"
)

// listener is a conn.Listener over one ROUTER socket. Its owner goroutine
// (run) holds the socket: it sends, closes and, after a panic or an
// unexpected reader exit, re-binds a fresh ROUTER on the same address.
type listener struct {
	t     *Transport
	ep    string // Scheme://host:port, real port
	addr  string // tcp://host:port, real port
	sendq chan zmq4.Msg
	recvq chan inFrame
	quit  chan struct{}
	done  chan struct{}
	once  sync.Once
}

type inFrame struct {
	route conn.Route
	frame []byte
}

var _ conn.Listener = (*listener)(nil)

func (t *Transport) startListener(sock zmq4.Socket, bound string) *listener {
	l := &listener{
		t:     t,
		ep:    Scheme + "://" + strings.TrimPrefix(bound, "tcp://"),
		addr:  bound,
		sendq: make(chan zmq4.Msg, t.opts.SendQueue),
		recvq: make(chan inFrame, t.opts.RecvQueue),
		quit:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	t.log.Info("listener bound", zap.String("addr", bound))
	go l.run(sock)
	return l
}

// healthyAfter is how long a socket must serve before its restart backoff
// resets.
const healthyAfter = 10 * time.Second

func (l *listener) run(sock zmq4.Socket) {
	defer close(l.done)
	attempt := 0
	for {
		began := time.Now()
		err := l.t.serveSocket(sock, nil, l.quit, l.sendq, l.deliver)
		if err == nil {
			return
		}
		l.t.ctr.restarts.Add(1)
		l.t.log.Warn("listener socket restarting", zap.String("addr", l.addr), zap.Error(err))
		if time.Since(began) > healthyAfter {
			attempt = 0
		}
		for sock = nil; sock == nil; {
			attempt++
			if !l.t.sleepDropping(l.t.backoff(attempt), l.quit, l.sendq) {
				return
			}
			if sock, _, err = l.t.bindRouter(l.ep); err != nil {
				l.t.log.Warn("listener rebind failed", zap.String("addr", l.addr), zap.Error(err))
			}
		}
	}
}

// deliver accepts [identity, frame] messages only.
func (l *listener) deliver(msg zmq4.Msg, stop <-chan struct{}) bool {
	if len(msg.Frames) != 2 {
		l.t.ctr.drop(DropBadParts)
		return true
	}
	if len(msg.Frames[1]) > conn.MaxFrameSize {
		l.t.ctr.drop(DropOversize)
		return true
	}
	select {
	case l.recvq <- inFrame{route: conn.Route(msg.Frames[0]), frame: msg.Frames[1]}:
		return true
	case <-stop:
		return false
	}
}

// Recv returns the next frame and the Route of the dialer that sent it.
func (l *listener) Recv(ctx context.Context) (conn.Route, []byte, error) {
	select {
	case <-l.quit:
		return "", nil, conn.ErrClosed
	default:
	}
	select {
	case f := <-l.recvq:
		return f.route, f.frame, nil
	case <-ctx.Done():
		return "", nil, ctx.Err()
	case <-l.quit:
		return "", nil, conn.ErrClosed
	}
}

// Send queues frame (copied) for the dialer behind route. It blocks only
// while the send queue is full, until ctx is done.
func (l *listener) Send(ctx context.Context, route conn.Route, frame []byte) error {
	if len(frame) > conn.MaxFrameSize {
		return ErrFrameTooLarge
	}
	msg := zmq4.NewMsgFrom([]byte(route), append([]byte(nil), frame...))
	return enqueue(ctx, l.quit, l.sendq, msg)
}

func (l *listener) Addr() string { return l.addr }

// Close stops the owner goroutine, which closes the socket; it returns
// once every goroutine of this Listener has exited.
func (l *listener) Close() error {
	l.once.Do(func() {
		close(l.quit)
		<-l.done
		l.t.log.Info("listener closed", zap.String("addr", l.addr))
	})
	return nil
}

func enqueue(ctx context.Context, quit <-chan struct{}, q chan<- zmq4.Msg, msg zmq4.Msg) error {
	select {
	case <-quit:
		return conn.ErrClosed
	default:
	}
	// Room in the queue first: with a ctx already done (the link's
	// sends), the select below would pick at random between a free slot
	// and ctx.
	select {
	case q <- msg:
		return nil
	default:
	}
	select {
	case q <- msg:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-quit:
		return conn.ErrClosed
	}
}
