// Command prefilld runs beside a prefill engine: it serves the engine's
// scheduler over gRPC, owns the bootstrap socket decode daemons connect to,
// pushes KV pages to them, and keeps every room visible until it ends.
package main

import (
	"github.com/pdlink/pdlink/internal/daemon"
	"github.com/pdlink/pdlink/internal/service"
)

// version is set by the linker (-X main.version=...).
var version string

func main() {
	daemon.Main(daemon.NewCommand(daemon.RolePrefill, version,
		"pdlink prefill daemon: moves KV cache to decode daemons, never pins a room", service.SetupPrefill))
}
