// Package deploy holds no code: it is the home of pdlink's deployment files
// and of the tests that hold them to the daemons.
//
//   - systemd/: prefilld.service and decoded.service (Type=notify with a
//     watchdog, hardened, a pdlink user and group shared with the engine),
//     their environment files (every PDLINK_* variable with its default,
//     commented out), sysusers.d and tmpfiles.d entries.
//   - k8s/: a kustomize base with a prefill and a decode Deployment (engine
//     container plus the daemon as a native sidecar sharing /dev/shm and the
//     socket directory, the token Secret mounted read-only in the sidecar),
//     headless Services for the bootstrap and data ports, NetworkPolicies, a
//     PodMonitor and a PrometheusRule; overlays/example sets the images and
//     namespace and generates the Secret from a token file the operator
//     creates (auth-token, never shipped).
//   - prometheus/: alert rules with runbooks, their promtool unit tests and a
//     scrape configuration for hosts running the systemd units.
//   - grafana/: a dashboard.
//
// # Tests
//
// go test ./deploy/... checks every file with the tool that consumes it:
// systemd-analyze verify and security, kustomize build (run from the Go
// module proxy) with every object decoded strictly into the Kubernetes and
// prometheus-operator API types, the example overlay's daemons started as
// rendered (env, mounts in the kubelet's layout, user and groups, 0.0.0.0
// binds) in two network namespaces of the test's own joined by a veth pair
// until both are ready and move a verified room (as root, with ip from
// iproute2; skipped otherwise), promtool check and test rules, and a real
// Prometheus scraping a scripted exporter to see the pin alert fire and
// resolve. Every query in the rules and the dashboard must name metrics the
// daemons export (metrics.Names() is the authority). A missing tool skips its
// test with a message, except under CI=true where it fails.
//
// Generated files are rewritten with go test ./deploy -update: the
// environment files (from the daemons' flags) and the PrometheusRule (from
// prometheus/pdlink.rules.yml).
package deploy
