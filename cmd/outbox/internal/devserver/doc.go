// Package devserver is the outbox's own Temporal development server: every Temporal
// service and the Web UI in one process, the state in a SQLite file (WAL mode) or in
// PostgreSQL, the namespace and the outbox's search attributes created at start. It links
// the Temporal server, so only the temporalserver binary imports it; outbox dev and outbox
// bench run that binary as a child process when no Temporal CLI is installed.
package devserver
