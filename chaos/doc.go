// Package chaos holds the fault-injection suite: the outbox binary's worker and relay run
// as OS processes against a private PostgreSQL cluster and a Temporal server (`outbox dev
// --only temporal`) that the suite may kill and restart, while a loader commits business
// transactions and an HTTP receiver counts what arrives. The package has no code of its
// own; the tests are in chaos_test.go and harness_test.go. It does not link the Temporal
// server: only the SDK client is used, against the real processes.
//
// Faults covered: the worker SIGKILLed mid-send, the relay SIGKILLed while it starts
// workflows, PostgreSQL restarted (fast shutdown) mid-run, the Temporal server stopped and
// started again on the same folder, and the downstream flapping (503s, connection resets,
// answers after the send timeout) for a window.
//
// Still to add: a topic answering 4xx (poison messages dead-lettered quickly) and a topic
// that hangs past its timeout while filling the worker's activity slots, beside healthy
// topics whose latency is reported next to a no-fault run.
//
// Run at full size with `make chaos` (OUTBOX_CHAOS_MESSAGES=1000); `go test ./chaos/`
// runs OUTBOX_CHAOS_MESSAGES (default 100) messages per fault.
package chaos
