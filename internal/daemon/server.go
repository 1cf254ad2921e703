package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/pdlink/pdlink/pkg/transfer"
)

// Server is one daemon process: its listeners, its gRPC and HTTP servers,
// its metrics registry and the components the role adds.
type Server struct {
	cfg     Config
	log     *zap.Logger
	version string

	// Registry holds every collector the daemon exports on /metrics.
	Registry *prometheus.Registry
	// GRPC is where the role registers its services before Run.
	GRPC *grpc.Server
	// Mux is where the role adds HTTP handlers (such as /debug/rooms) before Run.
	Mux *http.ServeMux

	health    *health.Server
	grpcLis   net.Listener
	grpcLimit *limitListener // wraps grpcLis: --grpc-max-connections
	httpLis   net.Listener
	httpSrv   *http.Server
	notifier  *Notifier

	group    Group
	pending  atomic.Int32  // components that have not called ready yet
	allReady chan struct{} // closed when pending reaches zero
	ready    atomic.Bool

	// healthMu orders readiness changes: once draining is set, a component
	// that turns ready late cannot flip the health service back to SERVING.
	healthMu    sync.Mutex
	draining    bool
	healthNames []string // "" and every served pdlink service, set by Run
	drain       func(ctx context.Context, deadline time.Time)
	unixPath    string

	reloaders []reloader // what SIGHUP re-reads (signals.go)
}

// NewServer binds the gRPC and HTTP listeners so that a bad or busy address
// fails the start with a clear error before anything runs.
func NewServer(cfg Config, log *zap.Logger, version string) (*Server, error) {
	s := &Server{cfg: cfg, log: log, version: version, notifier: NewNotifier(), allReady: make(chan struct{})}
	network, address, err := ParseListen(cfg.GRPCListen)
	if err != nil {
		return nil, &FlagError{"grpc-listen", cfg.GRPCListen, err.Error()}
	}
	if network == "unix" {
		if err := prepareUnixSocket(address); err != nil {
			return nil, fmt.Errorf("--grpc-listen %s: %w", cfg.GRPCListen, err)
		}
		s.unixPath = address
	}
	s.grpcLis, err = net.Listen(network, address)
	if err != nil {
		return nil, fmt.Errorf("--grpc-listen %s: %w", cfg.GRPCListen, err)
	}
	if network == "unix" {
		// Only the daemon's group (shared with the engine) may call it.
		if err := os.Chmod(address, 0o660); err != nil {
			s.grpcLis.Close()
			return nil, fmt.Errorf("--grpc-listen %s: %w", cfg.GRPCListen, err)
		}
	}
	s.httpLis, err = net.Listen("tcp", cfg.HTTPListen)
	if err != nil {
		s.grpcLis.Close()
		return nil, fmt.Errorf("--http-listen %s: %w", cfg.HTTPListen, err)
	}

	s.grpcLimit = newLimitListener(s.grpcLis, cfg.GRPCMaxConnections)
	s.Registry = prometheus.NewRegistry()
	s.Registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildInfo(cfg.Role, version),
		dataTransportInfo(cfg.Role, cfg.DataTransport),
	)
	s.Registry.MustRegister(shmCollectors(cfg.Role)...)
	s.Registry.MustRegister(s.grpcLimit.collectors(sideOf(cfg.Role))...)

	opts := []grpc.ServerOption{}
	if cfg.GRPCTLSCert != "" {
		creds, err := serverTLS(cfg)
		if err != nil {
			s.grpcLis.Close()
			s.httpLis.Close()
			return nil, err
		}
		opts = append(opts, grpc.Creds(creds))
	}
	s.GRPC = grpc.NewServer(append(opts, connectionLimits(cfg)...)...)
	s.health = health.NewServer()
	s.healthNames = []string{""}
	s.setReady(false)
	healthpb.RegisterHealthServer(s.GRPC, s.health)
	reflection.Register(s.GRPC)

	s.Mux = http.NewServeMux()
	s.Mux.Handle("/metrics", promhttp.HandlerFor(s.Registry, promhttp.HandlerOpts{Registry: s.Registry}))
	s.Mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	s.Mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	s.httpSrv = &http.Server{Handler: s.Mux, ReadHeaderTimeout: 5 * time.Second}

	s.Add("grpc", func(ready func()) error {
		ready()
		return s.GRPC.Serve(s.grpcLimit)
	}, func(error) { s.GRPC.Stop() })
	s.Add("http", func(ready func()) error {
		ready()
		if err := s.httpSrv.Serve(s.httpLis); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}, func(error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = s.httpSrv.Shutdown(ctx)
	})
	return s, nil
}

// connectionLimits bound what a client that is slow, silent or gone can
// hold: the handshake (TLS and HTTP/2 preface) must finish within
// --grpc-handshake-timeout; a connection with no stream is closed after
// --grpc-max-connection-idle; a quiet connection is pinged every
// --grpc-keepalive-time and closed if the ack takes longer than
// --grpc-keepalive-timeout. A connection with an open stream (a Watch with
// no traffic) is never idle, and a client may ping every
// --grpc-keepalive-min-time, with or without a stream; faster is abuse and
// gets GOAWAY.
func connectionLimits(cfg Config) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ConnectionTimeout(cfg.GRPCHandshakeTimeout),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             cfg.GRPCKeepaliveMinTime,
			PermitWithoutStream: true,
		}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle: cfg.GRPCMaxConnectionIdle,
			Time:              cfg.GRPCKeepaliveTime,
			Timeout:           cfg.GRPCKeepaliveTimeout,
		}),
		grpc.MaxRecvMsgSize(16 << 20),
	}
}

func prepareUnixSocket(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return err
	}
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("%s exists and is not a socket", path)
	}
	// A socket left by a previous run: refuse if someone still serves it.
	if c, err := net.DialTimeout("unix", path, 200*time.Millisecond); err == nil {
		c.Close()
		return fmt.Errorf("%s is in use by another process", path)
	}
	return os.Remove(path)
}

// GRPCAddr is the bound gRPC address (useful with port 0).
func (s *Server) GRPCAddr() net.Addr { return s.grpcLis.Addr() }

// HTTPAddr is the bound HTTP address (useful with port 0).
func (s *Server) HTTPAddr() net.Addr { return s.httpLis.Addr() }

// Ready reports whether every component serves.
func (s *Server) Ready() bool { return s.ready.Load() }

// Add registers a component. execute must call ready once it serves, then
// block until interrupt makes it return.
func (s *Server) Add(name string, execute func(ready func()) error, interrupt func(error)) {
	s.pending.Add(1)
	var once sync.Once
	markReady := func() {
		once.Do(func() {
			if s.pending.Add(-1) == 0 {
				close(s.allReady)
			}
		})
	}
	s.group.Add(func() error {
		err := execute(markReady)
		if err != nil {
			s.log.Error("component stopped", zap.String("component", name), zap.Error(err))
			return fmt.Errorf("%s: %w", name, err)
		}
		s.log.Info("component stopped", zap.String("component", name))
		return nil
	}, interrupt)
}

// OnDrain sets what happens between SIGTERM and stopping the components:
// the role refuses new rooms, lets inflight ones end until deadline
// (SIGTERM + --drain-timeout), fails the rest and keeps them pollable
// for a grace; it must return by ctx's deadline (the drain's cap).
func (s *Server) OnDrain(drain func(ctx context.Context, deadline time.Time)) { s.drain = drain }

// A planned stop ends within --drain-timeout + StopBound of SIGTERM: the
// drain hook returns by drainOverrun past the drain deadline, the
// components have until stopOverrun to stop, and the rest is margin for
// a loaded machine (timers fire late) and the process's own exit. A hook or a component that overruns is left behind:
// Run returns ErrStopTimeout.
const (
	// StopBound is how long past --drain-timeout a daemon may take to exit
	// after SIGTERM (TimeoutStopSec and terminationGracePeriodSeconds
	// must exceed the drain timeout by more).
	StopBound    = time.Second
	drainOverrun = 500 * time.Millisecond
	stopOverrun  = 800 * time.Millisecond
	// MaxDrainTerminalGrace leaves the drain time within drainOverrun for
	// the peers' ACKs and GOODBYE after the grace.
	MaxDrainTerminalGrace = 400 * time.Millisecond
)

// Run serves until ctx is done (SIGTERM) or a component fails. On ctx done
// it turns not-ready, drains until --drain-timeout (then the hook's grace,
// see OnDrain), stops the components, and returns within --drain-timeout
// + StopBound. Throughout, SIGHUP runs what OnReload registered.
func (s *Server) Run(ctx context.Context) error {
	defer s.handleHangup()()
	s.healthMu.Lock()
	s.healthNames = s.servedNames()
	s.healthMu.Unlock()
	s.setReady(false)
	stop := make(chan struct{})
	stopBy := make(chan time.Time, 1) // when Run must return, set at SIGTERM
	s.group.Add(func() error {
		select {
		case <-ctx.Done():
		case <-stop:
			return nil
		}
		deadline := time.Now().Add(s.cfg.DrainTimeout)
		stopBy <- deadline.Add(stopOverrun)
		s.startDrain()
		_ = s.notifier.Notify("STOPPING=1")
		s.log.Info("draining", zap.Duration("drain_timeout", s.cfg.DrainTimeout))
		if s.drain != nil {
			dctx, cancel := context.WithDeadline(context.Background(), deadline.Add(drainOverrun))
			s.drain(dctx, deadline)
			cancel()
		}
		return nil
	}, func(error) { close(stop) })

	watchdogStop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Add(1)
	go func() {
		defer bg.Done()
		select {
		case <-s.allReady:
			if !s.setReady(true) {
				s.log.Info("components ready after the drain started: staying not serving")
				return
			}
			s.log.Info("serving",
				zap.String("role", string(s.cfg.Role)),
				zap.String("version", s.version),
				zap.Stringer("grpc", s.grpcLis.Addr()),
				zap.Stringer("http", s.httpLis.Addr()))
			_ = s.notifier.Notify("READY=1")
			s.watchdog(watchdogStop)
		case <-watchdogStop:
		}
	}()

	result := make(chan error, 1)
	go func() { result <- s.group.Run() }()
	err := s.awaitStop(result, stopBy)
	close(watchdogStop)
	bg.Wait()
	s.setReady(false)
	if s.unixPath != "" {
		_ = os.Remove(s.unixPath)
	}
	return err
}

// awaitStop returns the group's result, or ErrStopTimeout once a planned
// stop has overrun its bound (the stuck goroutines go with the process).
func (s *Server) awaitStop(result <-chan error, stopBy <-chan time.Time) error {
	select {
	case err := <-result:
		return err
	case by := <-stopBy:
		t := time.NewTimer(time.Until(by))
		defer t.Stop()
		select {
		case err := <-result:
			return err
		case <-t.C:
			s.log.Error("components did not stop within the drain bound, exiting anyway",
				zap.Duration("drain_timeout", s.cfg.DrainTimeout), zap.Duration("bound", s.cfg.DrainTimeout+StopBound))
			return ErrStopTimeout
		}
	}
}

// setReady sets /readyz and the health status of every name in
// healthNames; it refuses to turn ready once a drain started.
func (s *Server) setReady(v bool) bool {
	s.healthMu.Lock()
	defer s.healthMu.Unlock()
	if v && s.draining {
		return false
	}
	s.ready.Store(v)
	status := healthpb.HealthCheckResponse_NOT_SERVING
	if v {
		status = healthpb.HealthCheckResponse_SERVING
	}
	for _, name := range s.healthNames {
		s.health.SetServingStatus(name, status)
	}
	return true
}

// startDrain turns the daemon not ready for good.
func (s *Server) startDrain() {
	s.healthMu.Lock()
	s.draining = true
	s.healthMu.Unlock()
	s.setReady(false)
}

// servedNames is what a health probe may ask for: "" and the full name of
// every service the role registered (pdlink.v1.PrefillService,
// pdlink.v1.AdminService...), but not the health and reflection services
// themselves. Any other name stays NotFound.
func (s *Server) servedNames() []string {
	names := []string{""}
	for name := range s.GRPC.GetServiceInfo() {
		if !strings.HasPrefix(name, "grpc.") {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return names
}

func (s *Server) watchdog(stop <-chan struct{}) {
	every := WatchdogInterval()
	if every == 0 || !s.notifier.Enabled() {
		<-stop
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			if s.ready.Load() {
				if err := s.notifier.Notify("WATCHDOG=1"); err != nil {
					s.log.Warn("watchdog notify failed", zap.Error(err))
				}
			}
		}
	}
}

func buildInfo(role Role, version string) prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "pdlink_build_info",
		Help: "Always 1; labels say which daemon and version runs.",
	}, []string{"side", "version"})
	g.WithLabelValues(sideOf(role), version).Set(1)
	return g
}

// dataTransportInfo says which data plane --data-transport chose, so a dashboard or an
// alert can tell a daemon on TCP from one on the same-host path without reading its flags.
func dataTransportInfo(role Role, kind transfer.Kind) prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "pdlink_data_transport_info",
		Help: "Always 1; the transport label is the --data-transport this daemon moves KV pages with.",
	}, []string{"side", "transport"})
	g.WithLabelValues(sideOf(role), string(kind)).Set(1)
	return g
}

// shmCollectors export the same-host data plane's counters (transfer.ShmTotals): offers
// refused by reason, data connections moving pages by shared memory now, (decode) the
// page bytes copied from prefill mappings and (prefill) the offers made again after a
// region was registered again.
func shmCollectors(role Role) []prometheus.Collector {
	side := sideOf(role)
	decode := role == RoleDecode
	var cs []prometheus.Collector
	for _, f := range transfer.AllShmFallbacks() {
		reason := f.String()
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "pdlink_shm_fallback_total",
			Help:        "Same-host offers refused, by reason (disabled, open, identity, map): that rank's pages go over TCP, or fail under --data-transport=shm; no_slices (prefill): accepted by a decode that does not copy head slices, so that rank's sliced streams go over TCP.",
			ConstLabels: prometheus.Labels{"side": side, "reason": reason},
		}, func() float64 { return float64(transfer.ShmTotals(decode).Fallbacks[reason]) }))
	}
	cs = append(cs,
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "pdlink_shm_accepted_total",
			Help:        "Same-host offers accepted: a data connection and rank whose pages decode copies from the prefill mapping.",
			ConstLabels: prometheus.Labels{"side": side},
		}, func() float64 { return float64(transfer.ShmTotals(decode).Accepted) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "pdlink_shm_connections",
			Help:        "Data connections moving pages by shared memory now (the rest move them over TCP).",
			ConstLabels: prometheus.Labels{"side": side},
		}, func() float64 { return float64(transfer.ShmTotals(decode).ShmConns) }))
	if decode {
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "pdlink_shm_copied_bytes_total",
			Help:        "Page bytes decode copied from prefill mappings (same-host pages).",
			ConstLabels: prometheus.Labels{"side": side},
		}, func() float64 { return float64(transfer.ShmTotals(true).CopiedBytes) }))
	} else {
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "pdlink_shm_reoffers_total",
			Help:        "Same-host offers made again on a data connection for a file it had offered, because the engine registered that file again (RegisterRegion of the same file, say once a truncated file is whole): decode proves it again, so what it found while the file was short is not kept.",
			ConstLabels: prometheus.Labels{"side": side},
		}, func() float64 { return float64(transfer.ShmTotals(false).Reoffers) }))
	}
	return cs
}

// sideOf is the side label of a role's metrics.
func sideOf(role Role) string {
	if role == RoleDecode {
		return "decode"
	}
	return "prefill"
}
