// Package daemon holds what prefilld and decoded share: the configuration
// and its flags (each also read from PDLINK_<FLAG_NAME>), logging, the HTTP
// endpoints (/metrics, /healthz, /readyz, /debug/rooms), the gRPC server
// with health and reflection, systemd notification, and the run group that
// starts every component and stops them all when one exits.
//
// # Design
//
// main only wires: flags parse into one Config, Validate refuses bad values
// with one line naming the flag, then Run starts the components as a Group
// of (execute, interrupt) pairs in the style of Prometheus. The first
// component to return stops the others. Readiness (/readyz, the gRPC health
// status, systemd READY=1) flips only once every component reported that it
// serves.
//
// # Goroutines
//
// Run owns one goroutine per component plus the signal watcher. Each
// component owns its own listener and the goroutines it starts; its
// interrupt function must make execute return. Nothing here touches room
// state: the role packages own it.
package daemon
