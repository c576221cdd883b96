// Package monitoring holds the test of the Grafana dashboard and the Prometheus alert
// rules beside it: every rule parses with Prometheus's own rule parser, and every
// expression of the rules and the dashboard names only metrics and labels the outbox
// exports (package metrics), besides Prometheus's own up and its target labels. It is a
// module of its own, tested with GOWORK=off, so that Prometheus's server module stays out
// of the library's module graph and out of the workspace's build list.
package monitoring
