package service

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"go.uber.org/zap"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/internal/daemon"
	"github.com/pdlink/pdlink/pkg/auth"
	"github.com/pdlink/pdlink/pkg/conn"
	"github.com/pdlink/pdlink/pkg/conn/zmtp"
	"github.com/pdlink/pdlink/pkg/metrics"
	"github.com/pdlink/pdlink/pkg/poll"
	"github.com/pdlink/pdlink/pkg/regionpath"
	"github.com/pdlink/pdlink/pkg/room"
)

// bootstrapHook lets in-process tests learn the bound bootstrap address.
var bootstrapHook func(addr string)

// Hooks for in-process tests that put a proxy in front of decode's data
// port (dataListenHook learns the bound address), edit prefill's room
// owner config (prefillHook: its sender's in-flight budget, say) or read
// decode's (decodeHook: what the flags made of its receiver's config).
var (
	dataListenHook func(addr string)
	prefillHook    func(*room.PrefillConfig)
	decodeHook     func(*room.DecodeConfig)
)

func tableConfig(cfg daemon.Config, side poll.Side) poll.Config {
	t := poll.DefaultConfig(side)
	t.BootstrapTimeout = cfg.BootstrapTimeout
	t.WaitingTimeout = cfg.WaitingTimeout
	t.TransferIdleTimeout = cfg.TransferIdleTimeout
	t.ClearLinger = cfg.ClearLinger
	t.MaxRooms = cfg.MaxRooms
	// Ended tombstones answer late frames (R2, R3): keep them as long as
	// the peer may still retry.
	t.TombstoneTTL = max(t.TombstoneTTL, cfg.BootstrapTimeout+cfg.WaitingTimeout)
	return t
}

func nodeConfig(cfg daemon.Config, side poll.Side, tr conn.Transport, log *zap.Logger) conn.Config {
	c := conn.DefaultConfig()
	c.Transport = tr
	c.Logger = log
	c.Table = tableConfig(cfg, side)
	c.HeartbeatInterval = cfg.HeartbeatInterval
	c.HeartbeatMisses = cfg.HeartbeatMisses
	return c
}

func frameCounts(c conn.Counters) []metrics.Count {
	var out []metrics.Count
	for _, t := range conn.AllFrameTypes() {
		out = append(out,
			metrics.Count{Labels: []string{t.String(), "out"}, Value: float64(c.Frames(t, conn.Sent))},
			metrics.Count{Labels: []string{t.String(), "in"}, Value: float64(c.Frames(t, conn.Received))})
	}
	return out
}

// rejectedCounts merges the node's frame rejections and the ZeroMQ guard's
// connection rejections (prefixed zmtp_) under one metric.
func rejectedCounts(c conn.Counters, z zmtp.Stats) []metrics.Count {
	var out []metrics.Count
	for _, r := range conn.AllRejectReasons() {
		out = append(out, metrics.Count{Labels: []string{r.String()}, Value: float64(c.Rejected(r))})
	}
	for reason, n := range z.Rejected {
		out = append(out, metrics.Count{Labels: []string{"zmtp_" + reason}, Value: float64(n)})
	}
	return out
}

// openKeyring loads the shared secret when --auth-token-file is set
// (nil otherwise) and has SIGHUP re-read it.
func openKeyring(s *daemon.Server, cfg daemon.Config, log *zap.Logger) (*auth.Keyring, error) {
	if cfg.AuthTokenFile == "" {
		return nil, nil
	}
	kr, err := auth.Open(auth.Config{Path: cfg.AuthTokenFile, Overlap: cfg.AuthOverlap,
		PromoteDelay: cfg.AuthPromoteDelay, Logger: log.Named("auth")})
	if err != nil {
		return nil, fmt.Errorf("--auth-token-file: %w", err)
	}
	log.Info("authentication on", zap.String("token", kr.Fingerprint()))
	// Reload logs its outcome; on error the tokens in force stay.
	s.OnReload("auth-token", func() { _, _ = kr.Reload() })
	return kr, nil
}

// authSources exports the keyring's counters (zeros without a keyring, so
// dashboards and alerts see the series either way).
func authSources(kr *auth.Keyring) (rejected, reloads func() []metrics.Count) {
	stats := func() auth.Stats {
		if kr == nil {
			return auth.Stats{}
		}
		return kr.Stats()
	}
	rejected = func() []metrics.Count {
		st := stats()
		var out []metrics.Count
		for _, r := range auth.AllReasons() {
			out = append(out, metrics.Count{Labels: []string{r.String()}, Value: float64(st.Rejected(r))})
		}
		return out
	}
	reloads = func() []metrics.Count {
		st := stats()
		return []metrics.Count{{Labels: []string{"ok"}, Value: float64(st.Reloads)}, {Labels: []string{"error"}, Value: float64(st.ReloadErrors)}}
	}
	return rejected, reloads
}

// drainer is what a drain needs of a room owner.
type drainer interface {
	Drain(ctx context.Context, p room.DrainPlan) room.DrainReport
}

// drainRooms refuses new rooms at once, then runs the node's drain: rooms
// finish until deadline, the rest fail with shutdown and stay pollable
// for grace while the peers hear of them (R8), then GOODBYE; all by ctx's
// deadline, the cap the daemon gives the drain.
func drainRooms(ctx context.Context, deadline time.Time, grace time.Duration, gate *Gate, node drainer) {
	gate.Drain()
	capAt, ok := ctx.Deadline()
	if !ok {
		capAt = deadline.Add(daemon.StopBound)
	}
	node.Drain(ctx, room.DrainPlan{Deadline: deadline, TerminalGrace: grace, Cap: capAt})
}

// SetupPrefill wires prefilld: the bootstrap socket, the room owner, the
// sender, the scheduler and admin services, metrics and /debug/rooms.
func SetupPrefill(s *daemon.Server, cfg daemon.Config, log *zap.Logger) error {
	kr, err := openKeyring(s, cfg, log)
	if err != nil {
		return err
	}
	tr := zmtp.New(zmtp.Options{Logger: log.Named("zmtp")})
	pcfg := room.PrefillConfig{
		Config:        nodeConfig(cfg, poll.Prefill, tr, log.Named("conn")),
		ListenAddr:    cfg.BootstrapListen,
		DataTransport: cfg.DataTransport,
		RegionDirs:    cfg.RegionDirs,
	}
	pcfg.Sender.Logger, pcfg.Sender.IdleTimeout = log.Named("transfer"), cfg.TransferIdleTimeout
	if kr != nil {
		pcfg.Sender.Auth, pcfg.Auth = kr.Data(), kr.Control(auth.SidePrefill)
	}
	rec := metrics.NewRecorder(metrics.SidePrefill)
	pcfg.Ended = observeEnd(rec)
	if prefillHook != nil {
		prefillHook(&pcfg)
	}
	node, err := room.NewPrefillOwner(pcfg)
	if err != nil {
		return err
	}
	gate := &Gate{}
	admin := &AdminServer{Owner: node, Side: pb.Side_SIDE_PREFILL, Now: time.Now}
	pb.RegisterPrefillServiceServer(s.GRPC, &PrefillServer{Node: node, Gate: gate})
	pb.RegisterAdminServiceServer(s.GRPC, admin)
	s.Mux.Handle("/debug/rooms", DebugRooms(admin))
	if err := registerMetrics(s, rec, sideMetrics{
		Side: metrics.SidePrefill, Config: cfg, Keyring: kr, Socket: tr.Stats,
		Rooms: node.Stats, Counters: node.Counters, Bytes: node.Bytes,
		RegionReplaced: node.RegionReplaced, RegionFaults: node.RegionFaults, RegionRefused: node.RegionRefused,
		PeerLayoutRefused: node.PeerLayoutsRefused, // prefill receives no data frames: DataRefused stays nil
	}); err != nil {
		return err
	}
	addNode(s, "prefill-node", func() error {
		if err := node.Start(context.Background()); err != nil {
			return err
		}
		log.Info("bootstrap socket bound", zap.String("addr", node.Addr()))
		if bootstrapHook != nil {
			bootstrapHook(node.Addr())
		}
		return nil
	}, func() { _ = node.Close() })
	s.OnDrain(func(ctx context.Context, deadline time.Time) {
		drainRooms(ctx, deadline, cfg.DrainTerminalGrace, gate, node)
	})
	return nil
}

// SetupDecode wires decoded: the data listener, the room owner, the
// receiver, the scheduler and admin services, metrics and /debug/rooms.
func SetupDecode(s *daemon.Server, cfg daemon.Config, log *zap.Logger) error {
	ln, err := net.Listen("tcp", cfg.DataListen)
	if err != nil {
		return err
	}
	if dataListenHook != nil {
		dataListenHook(ln.Addr().String())
	}
	advertise := cfg.DataAdvertise
	if advertise == "" {
		advertise = ln.Addr().String()
	}
	kr, err := openKeyring(s, cfg, log)
	if err != nil {
		ln.Close()
		return err
	}
	tr := zmtp.New(zmtp.Options{Logger: log.Named("zmtp")})
	dcfg := room.DecodeConfig{
		Config:        nodeConfig(cfg, poll.Decode, tr, log.Named("conn")),
		DataEndpoint:  advertise,
		DataTransport: cfg.DataTransport,
		RegionDirs:    cfg.RegionDirs,
	}
	dcfg.Receiver.Logger, dcfg.Receiver.IdleTimeout = log.Named("transfer"), cfg.TransferIdleTimeout
	dcfg.Receiver.CopyWorkers = cfg.ShmCopyWorkers
	if kr != nil {
		dcfg.Receiver.Auth, dcfg.Auth = kr.Data(), kr.Control(auth.SideDecode)
	}
	rec := metrics.NewRecorder(metrics.SideDecode)
	dcfg.Ended = observeEnd(rec)
	if decodeHook != nil {
		decodeHook(&dcfg)
	}
	node, err := room.NewDecodeOwner(dcfg)
	if err != nil {
		ln.Close()
		return err
	}
	gate := &Gate{}
	admin := &AdminServer{Owner: node, Side: pb.Side_SIDE_DECODE, Now: time.Now}
	pb.RegisterDecodeServiceServer(s.GRPC, &DecodeServer{Node: node, Gate: gate})
	pb.RegisterAdminServiceServer(s.GRPC, admin)
	s.Mux.Handle("/debug/rooms", DebugRooms(admin))
	if err := registerMetrics(s, rec, sideMetrics{
		Side: metrics.SideDecode, Config: cfg, Keyring: kr, Socket: tr.Stats,
		Rooms: node.Stats, Counters: node.Counters, Bytes: node.Bytes,
		RegionReplaced: node.RegionReplaced, RegionFaults: node.RegionFaults, RegionRefused: node.RegionRefused,
		DataRefused: node.DataRefused, // decode maps no layouts (prefill plans each pair): PeerLayoutRefused stays nil
	}); err != nil {
		ln.Close()
		return err
	}
	addNode(s, "decode-node", func() error { return node.Start(context.Background()) }, func() { _ = node.Close() })
	s.Add("data-listener", func(ready func()) error {
		log.Info("data listener bound", zap.String("addr", ln.Addr().String()))
		ready()
		return node.ServeData(ln)
	}, func(error) { ln.Close() })
	s.OnDrain(func(ctx context.Context, deadline time.Time) {
		drainRooms(ctx, deadline, cfg.DrainTerminalGrace, gate, node)
	})
	return nil
}

// addNode runs a room owner as a component: start it, serve until
// interrupted, then stop it.
func addNode(s *daemon.Server, name string, start func() error, stop func()) {
	interrupted := make(chan struct{})
	var once sync.Once
	s.Add(name, func(ready func()) error {
		if err := start(); err != nil {
			return err
		}
		ready()
		<-interrupted
		return nil
	}, func(error) {
		once.Do(func() { close(interrupted) })
		stop()
	})
}

// sideMetrics is what one daemon side exports on /metrics: its config and
// keyring, its socket's stats and its room owner's counters. A nil
// PeerLayoutRefused or DataRefused exports zeros: the series exist on both
// sides so dashboards and alerts need no side-specific queries.
type sideMetrics struct {
	Side     string // metrics.SidePrefill or metrics.SideDecode
	Config   daemon.Config
	Keyring  *auth.Keyring // nil without --auth-token-file
	Socket   func() zmtp.Stats
	Rooms    func() poll.Stats
	Counters func() conn.Counters
	// Bytes is the KV bytes moved (sent on prefill, written on decode).
	Bytes                        func() uint64
	RegionReplaced, RegionFaults func() uint64
	RegionRefused                func(regionpath.Rule) uint64
	PeerLayoutRefused            func(reason string) uint64
	DataRefused                  func(reason string) uint64
}

func registerMetrics(s *daemon.Server, rec *metrics.Recorder, m sideMetrics) error {
	authRejected, authReloads := authSources(m.Keyring)
	ctr, z, cfg := m.Counters, m.Socket, m.Config
	asFloat := func(f func() uint64) func() float64 { return func() float64 { return float64(f()) } }
	byReason := func(f func(string) uint64, reasons []string) func() []metrics.Count {
		return func() []metrics.Count {
			out := make([]metrics.Count, 0, len(reasons))
			for _, r := range reasons {
				var v uint64
				if f != nil {
					v = f(r)
				}
				out = append(out, metrics.Count{Labels: []string{r}, Value: float64(v)})
			}
			return out
		}
	}
	c := metrics.NewCollector(m.Side, metrics.Sources{
		Rooms:          m.Rooms,
		Frames:         func() []metrics.Count { return frameCounts(ctr()) },
		FramesRejected: func() []metrics.Count { return rejectedCounts(ctr(), z()) },
		Retransmits:    func() float64 { return float64(ctr().Retransmits) },
		Unsent:         func() float64 { return float64(ctr().SendErrors) },
		WatchDropped:   func() float64 { return float64(ctr().WatchDropped) },
		Peers: func() []metrics.Count {
			c := ctr()
			return []metrics.Count{{Labels: []string{"up"}, Value: float64(c.PeersUp)}, {Labels: []string{"lost"}, Value: float64(c.PeersDown)}}
		},
		PeerDepartures: func() []metrics.Count {
			c := ctr()
			return []metrics.Count{
				{Labels: []string{"goodbye"}, Value: float64(c.PeerGoodbyes)},
				{Labels: []string{"lost"}, Value: float64(c.PeersLost)},
				{Labels: []string{"restarted"}, Value: float64(c.PeerRestarts)},
			}
		},
		WorkerRestarts: func() []metrics.Count {
			return []metrics.Count{
				{Labels: []string{"node"}, Value: float64(ctr().WorkerRestarts)},
				{Labels: []string{"socket"}, Value: float64(z().Restarts)},
			}
		},
		TransferBytes:  asFloat(m.Bytes),
		RegionReplaced: asFloat(m.RegionReplaced),
		RegionFaults:   asFloat(m.RegionFaults),
		InsecureMode: func() float64 {
			if cfg.InsecureMode() {
				return 1
			}
			return 0
		},
		AuthRejected:      authRejected,
		AuthReloads:       authReloads,
		PeerLayoutRefused: byReason(m.PeerLayoutRefused, room.PeerLayoutRefusalReasons()),
		DataRefused:       byReason(m.DataRefused, room.DataRefusalReasons()),
		RegionRefused: func() []metrics.Count {
			var out []metrics.Count
			for _, r := range regionpath.AllRules() {
				out = append(out, metrics.Count{Labels: []string{r.String()}, Value: float64(m.RegionRefused(r))})
			}
			return out
		},
	})
	return metrics.Register(s.Registry, c, rec)
}

// observeEnd feeds the duration histograms from the owner's Ended hook:
// every room that ends is observed once, on the owner goroutine, however
// slow the Watch subscribers are (a Histogram's Observe never blocks).
func observeEnd(rec *metrics.Recorder) func(room.RoomEnd) {
	return func(e room.RoomEnd) {
		rec.ObserveRoomEnd(e.To == poll.Success, e.Life.Seconds())
		if e.To == poll.Success {
			rec.ObserveTransfer(e.Transfer.Seconds())
		}
	}
}
