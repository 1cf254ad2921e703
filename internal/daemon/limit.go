package daemon

import (
	"net"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// limitListener holds at most cap(slots) connections open at once and
// closes any further one as soon as it is accepted. Closing (rather than
// leaving it in the accept backlog, as netutil.LimitListener does) gives a
// client over the limit a fast failure to retry, and keeps a flood of idle
// connections from taking every file descriptor of the daemon.
type limitListener struct {
	net.Listener
	slots   chan struct{}
	refused atomic.Uint64
}

func newLimitListener(l net.Listener, max int) *limitListener {
	return &limitListener{Listener: l, slots: make(chan struct{}, max)}
}

// Accept returns the next connection that fits under the limit.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &limitConn{Conn: c, release: func() { <-l.slots }}, nil
		default:
			l.refused.Add(1)
			_ = c.Close()
		}
	}
}

// open is the number of connections holding a slot.
func (l *limitListener) open() int { return len(l.slots) }

// collectors export the open and refused counts of a listener.
func (l *limitListener) collectors(side string) []prometheus.Collector {
	labels := prometheus.Labels{"side": side}
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "pdlink_grpc_connections", ConstLabels: labels,
			Help: "Connections open on the gRPC listener.",
		}, func() float64 { return float64(l.open()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "pdlink_grpc_connections_refused_total", ConstLabels: labels,
			Help: "Connections closed on accept because --grpc-max-connections were open.",
		}, func() float64 { return float64(l.refused.Load()) }),
	}
}

// limitConn gives its slot back on the first Close.
type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
