// Command decoded runs beside a decode engine: it serves the engine's
// scheduler over gRPC, connects to prefill daemons, writes the KV pages it
// receives into the engine's memory, and keeps every room visible until it
// ends.
package main

import (
	"github.com/pdlink/pdlink/internal/daemon"
	"github.com/pdlink/pdlink/internal/service"
)

// version is set by the linker (-X main.version=...).
var version string

func main() {
	daemon.Main(daemon.NewCommand(daemon.RoleDecode, version,
		"pdlink decode daemon: receives KV cache from prefill daemons, never pins a room", service.SetupDecode))
}
