package daemon

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap/zapcore"

	"github.com/pdlink/pdlink/pkg/auth"
	"github.com/pdlink/pdlink/pkg/regionpath"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// Role says which daemon a Config is for.
type Role string

// The two daemons.
const (
	RolePrefill Role = "prefilld"
	RoleDecode  Role = "decoded"
)

// Config is every setting of a daemon, filled from flags and environment.
type Config struct {
	Role Role

	GRPCListen string
	HTTPListen string
	LogLevel   string
	LogFormat  string

	BootstrapTimeout    time.Duration
	WaitingTimeout      time.Duration
	TransferIdleTimeout time.Duration
	ClearLinger         time.Duration
	HeartbeatInterval   time.Duration
	HeartbeatMisses     int
	DrainTimeout        time.Duration
	// DrainTerminalGrace is how long the rooms that ended during a drain
	// stay pollable before the daemon stops serving (StopBound caps it).
	DrainTerminalGrace time.Duration
	MaxRooms           int

	// AuthTokenFile holds the deployment's shared secret (re-read on
	// SIGHUP); AuthOverlap is how long the previous token stays accepted
	// after a rotation. Insecure allows non-loopback listeners without a
	// secret.
	AuthTokenFile    string
	AuthOverlap      time.Duration
	AuthPromoteDelay time.Duration
	Insecure         bool
	// Exposed lists the peer-facing listeners reachable from other hosts
	// (set by Validate); with no secret they need Insecure.
	Exposed []string

	// GRPCTLSCert and GRPCTLSKey serve gRPC on TCP with TLS; GRPCClientCA
	// also requires client certificates signed by it (mTLS).
	GRPCTLSCert  string
	GRPCTLSKey   string
	GRPCClientCA string

	// What a gRPC client that is slow, silent or gone may hold (see
	// connectionLimits): the handshake deadline, the lifetime of a
	// connection with no stream, the keepalive ping period and ack
	// deadline, the fastest client ping rate allowed, and the most
	// connections open at once.
	GRPCHandshakeTimeout  time.Duration
	GRPCMaxConnectionIdle time.Duration
	GRPCKeepaliveTime     time.Duration
	GRPCKeepaliveTimeout  time.Duration
	GRPCKeepaliveMinTime  time.Duration
	GRPCMaxConnections    int

	// BootstrapListen is prefilld's ZeroMQ bind address.
	BootstrapListen string
	// DataListen is decoded's TCP listener for KV pages.
	DataListen string
	// ShmCopyWorkers is how many goroutines of decoded copy one same-host
	// chunk (transfer.ReceiverConfig.CopyWorkers, 1 to
	// transfer.MaxCopyWorkers): 1 by default, since a second one gave no
	// GB/s on the shared 2-core machine; a host with a spare core per data
	// connection may raise it.
	ShmCopyWorkers int
	// DataAdvertise is the host:port decoded tells prefill daemons to
	// send pages to ("" = the bound DataListen address): set it when
	// DataListen is a wildcard or sits behind NAT or a proxy.
	DataAdvertise string
	// DataTransport is the data plane that moves KV pages (both daemons):
	// one of transfer.Kinds, checked at start. auto by default: same-host
	// pages where decode proves the prefill file, TCP elsewhere.
	DataTransport transfer.Kind

	// RegionDirs are the directories a RegisterRegion path must lie under
	// (--region-dir, repeatable or comma-separated; pkg/regionpath has the
	// other rules): a scheduler client can name no other file.
	RegionDirs []string

	// CPUProfile is where a CPU profile of the whole run is written
	// ("" = none): profile.go.
	CPUProfile string
}

// DefaultRegionDir is where the systemd units have tmpfiles.d make the
// region directory (group pdlink, setgid).
const DefaultRegionDir = "/dev/shm/pdlink"

// DefaultConfig returns the defaults for a role; the flags show them.
func DefaultConfig(role Role) Config {
	c := Config{
		Role:                role,
		GRPCListen:          "unix:///run/pdlink/" + string(role) + ".sock",
		HTTPListen:          "127.0.0.1:9400",
		LogLevel:            "info",
		LogFormat:           "json",
		BootstrapTimeout:    30 * time.Second,
		WaitingTimeout:      30 * time.Second,
		TransferIdleTimeout: 10 * time.Second,
		ClearLinger:         5 * time.Minute,
		HeartbeatInterval:   time.Second,
		HeartbeatMisses:     3,
		DrainTimeout:        30 * time.Second,
		DrainTerminalGrace:  300 * time.Millisecond,
		MaxRooms:            65536,
		AuthOverlap:         auth.DefaultOverlap,
		AuthPromoteDelay:    auth.DefaultPromoteDelay,

		GRPCHandshakeTimeout:  10 * time.Second,
		GRPCMaxConnectionIdle: 5 * time.Minute,
		GRPCKeepaliveTime:     30 * time.Second,
		GRPCKeepaliveTimeout:  10 * time.Second,
		GRPCKeepaliveMinTime:  5 * time.Second,
		GRPCMaxConnections:    1024,

		DataTransport: transfer.KindAuto,
		RegionDirs:    []string{DefaultRegionDir},
	}
	switch role {
	case RolePrefill:
		c.BootstrapListen = "tcp://127.0.0.1:8998"
	case RoleDecode:
		c.HTTPListen = "127.0.0.1:9401"
		c.DataListen = "127.0.0.1:9500"
		c.ShmCopyWorkers = 1
	}
	return c
}

// BindFlags registers the flags of c's role on fs, with c's values as
// defaults. Parsing fs writes into c.
func (c *Config) BindFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.GRPCListen, "grpc-listen", c.GRPCListen, "scheduler gRPC address: unix:///path or host:port")
	fs.StringVar(&c.HTTPListen, "http-listen", c.HTTPListen, "host:port for /metrics, /healthz, /readyz, /debug/rooms")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "json or console")
	fs.DurationVar(&c.BootstrapTimeout, "bootstrap-timeout", c.BootstrapTimeout, "longest a room may stay in Bootstrapping")
	fs.DurationVar(&c.WaitingTimeout, "waiting-timeout", c.WaitingTimeout, "longest a room may stay in WaitingForInput")
	fs.DurationVar(&c.TransferIdleTimeout, "transfer-idle-timeout", c.TransferIdleTimeout, "longest a Transferring room may go without progress")
	fs.DurationVar(&c.ClearLinger, "clear-linger", c.ClearLinger, "how long a terminal room waits for Clear before it is reaped as uncleared")
	fs.DurationVar(&c.HeartbeatInterval, "heartbeat-interval", c.HeartbeatInterval, "interval between heartbeats to each peer")
	fs.IntVar(&c.HeartbeatMisses, "heartbeat-misses", c.HeartbeatMisses, "missed heartbeats in a row after which a peer is lost")
	fs.DurationVar(&c.DrainTimeout, "drain-timeout", c.DrainTimeout, "on SIGTERM, how long inflight rooms may finish before they fail with shutdown")
	fs.DurationVar(&c.DrainTerminalGrace, "drain-terminal-grace", c.DrainTerminalGrace, "after the drain timeout, how long the rooms it failed stay pollable before the daemon stops serving (at most 400ms)")
	fs.IntVar(&c.MaxRooms, "max-rooms", c.MaxRooms, "most rooms held at once; more are refused with ResourceExhausted")
	fs.StringVar(&c.AuthTokenFile, "auth-token-file", c.AuthTokenFile, "file holding the shared secret peers prove (re-read on SIGHUP)")
	fs.DurationVar(&c.AuthOverlap, "auth-token-overlap", c.AuthOverlap, "after a token rotation, how long a token dropped from the file stays accepted")
	fs.DurationVar(&c.AuthPromoteDelay, "auth-token-promote-delay", c.AuthPromoteDelay, "after a reload, how long the previous token still signs while the new one is already accepted")
	fs.BoolVar(&c.Insecure, "insecure", c.Insecure, "allow non-loopback listeners without --auth-token-file")
	fs.StringVar(&c.GRPCTLSCert, "grpc-tls-cert", c.GRPCTLSCert, "PEM certificate for gRPC on TCP (with --grpc-tls-key)")
	fs.StringVar(&c.GRPCTLSKey, "grpc-tls-key", c.GRPCTLSKey, "PEM private key for --grpc-tls-cert")
	fs.StringVar(&c.GRPCClientCA, "grpc-client-ca", c.GRPCClientCA, "PEM CA that gRPC clients' certificates must chain to (mTLS)")
	fs.DurationVar(&c.GRPCHandshakeTimeout, "grpc-handshake-timeout", c.GRPCHandshakeTimeout, "a gRPC connection that has not finished its TLS and HTTP/2 handshake by then is closed")
	fs.DurationVar(&c.GRPCMaxConnectionIdle, "grpc-max-connection-idle", c.GRPCMaxConnectionIdle, "a gRPC connection with no open stream for this long is closed (GOAWAY); clients reconnect")
	fs.DurationVar(&c.GRPCKeepaliveTime, "grpc-keepalive-time", c.GRPCKeepaliveTime, "ping a gRPC connection quiet for this long (at least 1s)")
	fs.DurationVar(&c.GRPCKeepaliveTimeout, "grpc-keepalive-timeout", c.GRPCKeepaliveTimeout, "close a gRPC connection whose ping is not acked within this")
	fs.DurationVar(&c.GRPCKeepaliveMinTime, "grpc-keepalive-min-time", c.GRPCKeepaliveMinTime, "clients may ping at most this often; faster gets GOAWAY (too_many_pings)")
	fs.IntVar(&c.GRPCMaxConnections, "grpc-max-connections", c.GRPCMaxConnections, "most gRPC connections open at once; more are closed on accept")
	fs.Var(&regionDirsFlag{dirs: &c.RegionDirs}, "region-dir", "directory a RegisterRegion file must lie under: a regular file of the daemon's group, no symlink on the way (repeat the flag or separate by commas for more)")
	fs.StringVar((*string)(&c.DataTransport), "data-transport", string(c.DataTransport), "how KV pages move between the daemons: "+transfer.KindNames())
	c.bindProfileFlags(fs)
	switch c.Role {
	case RolePrefill:
		fs.StringVar(&c.BootstrapListen, "bootstrap-listen", c.BootstrapListen, "ZeroMQ bind address for decode daemons: tcp://host:port")
	case RoleDecode:
		fs.StringVar(&c.DataListen, "data-listen", c.DataListen, "host:port of the TCP listener for KV pages")
		fs.StringVar(&c.DataAdvertise, "data-advertise", c.DataAdvertise, "host:port prefill daemons send pages to (default: the bound --data-listen address)")
		fs.IntVar(&c.ShmCopyWorkers, "shm-copy-workers", c.ShmCopyWorkers, fmt.Sprintf("goroutines that copy one same-host chunk from the prefill mapping (1 to %d)", transfer.MaxCopyWorkers))
	}
}

// FlagError is a refused flag value; its message is one line naming the flag.
type FlagError struct {
	Flag   string
	Value  string
	Reason string
}

func (e *FlagError) Error() string {
	return fmt.Sprintf("invalid --%s %q: %s", e.Flag, e.Value, e.Reason)
}

// Validate refuses the first bad value, naming its flag.
func (c *Config) Validate() error {
	if _, _, err := ParseListen(c.GRPCListen); err != nil {
		return &FlagError{"grpc-listen", c.GRPCListen, err.Error()}
	}
	if err := checkHostPort(c.HTTPListen); err != nil {
		return &FlagError{"http-listen", c.HTTPListen, err.Error()}
	}
	var lvl zapcore.Level
	if err := lvl.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return &FlagError{"log-level", c.LogLevel, "want debug, info, warn or error"}
	}
	if c.LogFormat != "json" && c.LogFormat != "console" {
		return &FlagError{"log-format", c.LogFormat, "want json or console"}
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{
		{"bootstrap-timeout", c.BootstrapTimeout},
		{"waiting-timeout", c.WaitingTimeout},
		{"transfer-idle-timeout", c.TransferIdleTimeout},
		{"clear-linger", c.ClearLinger},
		{"heartbeat-interval", c.HeartbeatInterval},
	} {
		if d.v <= 0 {
			return &FlagError{d.flag, d.v.String(), "must be positive"}
		}
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
		min  time.Duration
	}{
		{"grpc-handshake-timeout", c.GRPCHandshakeTimeout, time.Millisecond},
		{"grpc-max-connection-idle", c.GRPCMaxConnectionIdle, time.Millisecond},
		// gRPC raises a keepalive time below 1s to 1s without a word.
		{"grpc-keepalive-time", c.GRPCKeepaliveTime, time.Second},
		{"grpc-keepalive-timeout", c.GRPCKeepaliveTimeout, time.Millisecond},
		{"grpc-keepalive-min-time", c.GRPCKeepaliveMinTime, time.Millisecond},
	} {
		if d.v < d.min {
			return &FlagError{d.flag, d.v.String(), "must be at least " + d.min.String()}
		}
	}
	if c.GRPCMaxConnections < 1 {
		return &FlagError{"grpc-max-connections", fmt.Sprint(c.GRPCMaxConnections), "must be at least 1"}
	}
	if c.DrainTimeout < 0 {
		return &FlagError{"drain-timeout", c.DrainTimeout.String(), "must not be negative"}
	}
	if c.DrainTerminalGrace < 0 || c.DrainTerminalGrace > MaxDrainTerminalGrace {
		return &FlagError{"drain-terminal-grace", c.DrainTerminalGrace.String(), "must be between 0 and " + MaxDrainTerminalGrace.String() + " (the daemon exits within --drain-timeout + " + StopBound.String() + ")"}
	}
	if c.HeartbeatMisses < 1 {
		return &FlagError{"heartbeat-misses", fmt.Sprint(c.HeartbeatMisses), "must be at least 1"}
	}
	if c.AuthOverlap < 0 {
		return &FlagError{"auth-token-overlap", c.AuthOverlap.String(), "must not be negative"}
	}
	if c.AuthPromoteDelay < 0 {
		return &FlagError{"auth-token-promote-delay", c.AuthPromoteDelay.String(), "must not be negative"}
	}
	if (c.GRPCTLSCert == "") != (c.GRPCTLSKey == "") {
		return &FlagError{"grpc-tls-cert", c.GRPCTLSCert, "--grpc-tls-cert and --grpc-tls-key go together"}
	}
	if c.GRPCClientCA != "" && c.GRPCTLSCert == "" {
		return &FlagError{"grpc-client-ca", c.GRPCClientCA, "needs --grpc-tls-cert and --grpc-tls-key"}
	}
	if c.GRPCTLSCert != "" && strings.HasPrefix(c.GRPCListen, "unix://") {
		return &FlagError{"grpc-tls-cert", c.GRPCTLSCert, "TLS is for a TCP --grpc-listen; the unix socket relies on file permissions"}
	}
	if c.MaxRooms < 1 {
		return &FlagError{"max-rooms", fmt.Sprint(c.MaxRooms), "must be at least 1"}
	}
	if len(c.RegionDirs) == 0 {
		return &FlagError{"region-dir", "", "at least one region directory is required"}
	}
	for _, d := range c.RegionDirs {
		if err := regionpath.ValidateDir(d); err != nil {
			return &FlagError{"region-dir", d, err.Error()}
		}
	}
	kind, err := transfer.ParseKind(string(c.DataTransport))
	if err != nil {
		return &FlagError{"data-transport", string(c.DataTransport), "want " + transfer.KindNames()}
	}
	c.DataTransport = kind
	switch c.Role {
	case RolePrefill:
		if err := checkZMQEndpoint(c.BootstrapListen); err != nil {
			return &FlagError{"bootstrap-listen", c.BootstrapListen, err.Error()}
		}
	case RoleDecode:
		if c.ShmCopyWorkers < 1 || c.ShmCopyWorkers > transfer.MaxCopyWorkers {
			return &FlagError{"shm-copy-workers", fmt.Sprint(c.ShmCopyWorkers), fmt.Sprintf("must be 1 to %d", transfer.MaxCopyWorkers)}
		}
		if err := checkHostPort(c.DataListen); err != nil {
			return &FlagError{"data-listen", c.DataListen, err.Error()}
		}
		if c.DataAdvertise != "" {
			if err := checkHostPort(c.DataAdvertise); err != nil {
				return &FlagError{"data-advertise", c.DataAdvertise, err.Error()}
			}
			if err := checkDialable(c.DataAdvertise); err != nil {
				return &FlagError{"data-advertise", c.DataAdvertise, err.Error()}
			}
		} else if wildcardHost(c.DataListen) {
			// The bound address would be sent to prefill daemons as is, and
			// no peer can dial 0.0.0.0: every room would end at a deadline
			// with no error naming the cause.
			return &FlagError{"data-advertise", "", "required when --data-listen is a wildcard (" + c.DataListen + "): give the address prefill daemons dial, e.g. the pod or host IP"}
		}
	default:
		return fmt.Errorf("unknown role %q", c.Role)
	}
	return c.checkExposure()
}

// checkExposure applies the rule of DESIGN.md section 5: without a shared
// secret, peer-facing listeners stay on loopback unless --insecure; a gRPC
// listener on TCP beyond loopback needs mTLS (the token does not guard the
// scheduler API) or --insecure.
func (c *Config) checkExposure() error {
	peer := auth.Endpoint{Flag: "bootstrap-listen", Addr: c.BootstrapListen}
	if c.Role == RoleDecode {
		peer = auth.Endpoint{Flag: "data-listen", Addr: c.DataListen}
	}
	exposed, err := auth.CheckListen(c.AuthTokenFile != "", c.Insecure, peer)
	if err != nil {
		return err
	}
	grpcExposed, err := auth.CheckListen(c.GRPCClientCA != "", c.Insecure, auth.Endpoint{Flag: "grpc-listen", Addr: c.GRPCListen})
	if err != nil {
		return fmt.Errorf("%w (or --grpc-tls-cert, --grpc-tls-key and --grpc-client-ca for the scheduler API)", err)
	}
	c.Exposed = c.Exposed[:0]
	for _, e := range exposed {
		c.Exposed = append(c.Exposed, "--"+e.Flag+"="+e.Addr)
	}
	if c.GRPCClientCA == "" {
		for _, e := range grpcExposed {
			c.Exposed = append(c.Exposed, "--"+e.Flag+"="+e.Addr)
		}
	}
	return nil
}

// InsecureMode reports whether the daemon runs reachable from other hosts
// without authentication (--insecure in use): pdlink_insecure_mode.
func (c *Config) InsecureMode() bool {
	return c.AuthTokenFile == "" && len(c.Exposed) > 0
}

// ParseListen splits a listen address into a network for net.Listen:
// "unix:///run/x.sock" gives ("unix", "/run/x.sock"), "host:port" gives
// ("tcp", "host:port").
func ParseListen(addr string) (network, address string, err error) {
	if strings.HasPrefix(addr, "unix://") {
		p := strings.TrimPrefix(addr, "unix://")
		if !strings.HasPrefix(p, "/") {
			return "", "", errors.New("unix socket path must be absolute: unix:///path")
		}
		return "unix", p, nil
	}
	if strings.Contains(addr, "://") {
		return "", "", errors.New("want unix:///path or host:port")
	}
	if err := checkHostPort(addr); err != nil {
		return "", "", err
	}
	return "tcp", addr, nil
}

func checkHostPort(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return errors.New("want host:port")
	}
	if host != "" && net.ParseIP(host) == nil && host != "localhost" {
		return errors.New("host must be an IP address or localhost")
	}
	p, err := net.LookupPort("tcp", port)
	if err != nil || p < 0 || p > 65535 {
		return errors.New("port must be 0..65535")
	}
	return nil
}

// wildcardHost reports whether a host:port listens on every address.
func wildcardHost(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return host == "" || (ip != nil && ip.IsUnspecified())
}

// checkDialable refuses an address that a peer cannot dial: a wildcard host
// or port 0.
func checkDialable(addr string) error {
	if wildcardHost(addr) {
		return errors.New("must name an address peers can dial, not a wildcard")
	}
	if _, port, _ := net.SplitHostPort(addr); port == "0" {
		return errors.New("must name the port peers dial, not 0")
	}
	return nil
}

func checkZMQEndpoint(ep string) error {
	u, err := url.Parse(ep)
	if err != nil || u.Scheme != "tcp" || u.Host == "" || u.Path != "" {
		return errors.New("want tcp://host:port")
	}
	return checkHostPort(u.Host)
}

// regionDirsFlag is --region-dir: the first value given replaces the
// default and later ones add to it; a value may hold several directories
// separated by commas (the form of PDLINK_REGION_DIR).
type regionDirsFlag struct {
	dirs *[]string
	set  bool
}

func (f *regionDirsFlag) String() string { return strings.Join(*f.dirs, ",") }
func (f *regionDirsFlag) Type() string   { return "dirs" }

func (f *regionDirsFlag) Set(v string) error {
	if !f.set {
		*f.dirs, f.set = nil, true
	}
	for _, d := range strings.Split(v, ",") {
		if d = strings.TrimSpace(d); d != "" {
			*f.dirs = append(*f.dirs, d)
		}
	}
	return nil
}
