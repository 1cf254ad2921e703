package transfer

import (
	"context"
	"fmt"
	"net"
	"sync"
)

// MemNetwork is the in-memory twin of the TCP data network: a Dialer and listeners whose
// connections are net.Pipe pairs, so a Sender and a Receiver in one process exchange the
// same frames as over TCP, with one memory copy from source pages into destination pages.
// Disconnect breaks live connections, for partition tests.
type MemNetwork struct {
	mu        sync.Mutex
	listeners map[string]*memListener
	conns     map[string]map[net.Conn]struct{}
	refuse    map[string]bool
}

// NewMemNetwork returns an empty in-memory network.
func NewMemNetwork() *MemNetwork {
	return &MemNetwork{listeners: map[string]*memListener{}, conns: map[string]map[net.Conn]struct{}{}, refuse: map[string]bool{}}
}

type memAddr string

func (a memAddr) Network() string { return "mem" }
func (a memAddr) String() string  { return string(a) }

type memListener struct {
	n      *MemNetwork
	addr   string
	accept chan net.Conn
	done   chan struct{}
	once   sync.Once
}

// Listen returns a listener for addr; Receiver.Serve accepts on it.
func (n *MemNetwork) Listen(addr string) (net.Listener, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.listeners[addr]; ok {
		return nil, fmt.Errorf("mem listen %s: address in use", addr)
	}
	l := &memListener{n: n, addr: addr, accept: make(chan net.Conn), done: make(chan struct{})}
	n.listeners[addr] = l
	return l, nil
}

func (l *memListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.accept:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *memListener) Close() error {
	l.once.Do(func() {
		close(l.done)
		l.n.mu.Lock()
		if l.n.listeners[l.addr] == l {
			delete(l.n.listeners, l.addr)
		}
		l.n.mu.Unlock()
	})
	return nil
}

func (l *memListener) Addr() net.Addr { return memAddr(l.addr) }

// DialContext connects to a listener of this network.
func (n *MemNetwork) DialContext(ctx context.Context, _, addr string) (net.Conn, error) {
	n.mu.Lock()
	l := n.listeners[addr]
	refused := n.refuse[addr]
	n.mu.Unlock()
	if l == nil || refused {
		return nil, fmt.Errorf("mem dial %s: connection refused", addr)
	}
	client, server := net.Pipe()
	select {
	case l.accept <- server:
	case <-l.done:
		client.Close()
		server.Close()
		return nil, fmt.Errorf("mem dial %s: connection refused", addr)
	case <-ctx.Done():
		client.Close()
		server.Close()
		return nil, ctx.Err()
	}
	n.mu.Lock()
	if n.conns[addr] == nil {
		n.conns[addr] = map[net.Conn]struct{}{}
	}
	n.conns[addr][client] = struct{}{}
	n.conns[addr][server] = struct{}{}
	n.mu.Unlock()
	return client, nil
}

// Disconnect closes every live connection to addr. With refuse set, later dials to addr fail
// until Disconnect is called again with refuse false.
func (n *MemNetwork) Disconnect(addr string, refuse bool) {
	n.mu.Lock()
	cs := n.conns[addr]
	delete(n.conns, addr)
	n.refuse[addr] = refuse
	n.mu.Unlock()
	for c := range cs {
		c.Close()
	}
}
