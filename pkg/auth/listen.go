package auth

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// Endpoint is one address a daemon listens on, with the flag that set it
// (for the error message).
type Endpoint struct {
	Flag string // e.g. "bootstrap-listen"
	Addr string // "host:port", "tcp://host:port", "unix:///path", "ipc:///path" or "/path"
}

// CheckListen enforces the rule for a daemon without a shared secret: it
// may listen on loopback addresses and unix sockets only, unless insecure
// (--insecure) is set. It returns the endpoints that are not loopback (for
// the start-up warning of an insecure daemon) and, when the rule is broken,
// an error wrapping ErrInsecureListen, one line naming the flag, the address
// and both fixes. An address it cannot parse is an error (ErrBadListen)
// whatever the other arguments.
func CheckListen(haveSecret, insecure bool, eps ...Endpoint) (exposed []Endpoint, err error) {
	for _, ep := range eps {
		lo, err := IsLoopback(ep.Addr)
		if err != nil {
			return nil, fmt.Errorf("--%s %q: %w", ep.Flag, ep.Addr, err)
		}
		if !lo {
			exposed = append(exposed, ep)
		}
	}
	if len(exposed) > 0 && !haveSecret && !insecure {
		ep := exposed[0]
		return exposed, fmt.Errorf("%w: --%s %q is reachable from other hosts; set --auth-token-file (or PDLINK_AUTH_TOKEN_FILE) to a file holding the deployment's shared token, or pass --insecure to run without authentication",
			ErrInsecureListen, ep.Flag, ep.Addr)
	}
	return exposed, nil
}

// IsLoopback reports whether a listen address can only be reached from this
// host: a unix socket (unix://, ipc://, inproc:// or an absolute path), an
// address in 127.0.0.0/8 or ::1 (also IPv4-mapped), or "localhost". A
// wildcard (0.0.0.0, ::, "*", an empty host) and any other host name or
// interface name are not loopback.
func IsLoopback(addr string) (bool, error) {
	if strings.HasPrefix(addr, "/") {
		return true, nil
	}
	hostport := addr
	if scheme, rest, ok := strings.Cut(addr, "://"); ok {
		switch scheme {
		case "unix", "ipc", "inproc":
			return true, nil
		case "tcp":
			hostport = rest
		default:
			return false, fmt.Errorf("%w: unknown scheme %q", ErrBadListen, scheme)
		}
	}
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false, fmt.Errorf("%w: %v", ErrBadListen, err)
	}
	if strings.EqualFold(host, "localhost") {
		return true, nil
	}
	ip, err := netip.ParseAddr(strings.Trim(host, "[]"))
	if err != nil {
		return false, nil // "", "*", a host or interface name: assume reachable
	}
	return ip.Unmap().IsLoopback(), nil
}
