// Package chaos holds the fault-injection suite: the outbox binary's worker and relay run
// as OS processes against a private PostgreSQL cluster and a Temporal server (`outbox dev
// --only temporal`) that the suite may kill and restart, while a loader commits business
// transactions and an HTTP receiver counts what arrives. The package has no code of its
// own; the tests are in chaos_test.go and harness_test.go. It does not link the Temporal
// server: only the SDK client is used, against the real processes.
//
// Faults covered: the worker SIGKILLed mid-send, `outbox run` (worker and relay in one
// process) SIGKILLed three times during a drain, one of two `outbox run` processes on
// the same database SIGKILLed during a drain, the relay SIGKILLed while it starts
// workflows, PostgreSQL restarted (fast shutdown) mid-run, the Temporal server stopped and
// started again on the same folder, the outbox's own PostgreSQL down for 30 seconds with
// sends in flight (separate processes and outbox run), the downstream flapping (503s,
// connection resets, answers after the send timeout) for a window, a NATS JetStream
// server that the healthy topic publishes to restarted mid-run (under the default
// delivery policy; the stream's duplicate window must absorb every resend), and a topic
// answering 422 plus a topic that never answers (its sends filling the worker's eight
// activity slots until they time out) beside the healthy topic, whose commit-to-sent
// latency is reported next to a run without them.
//
// Run at full size with `make chaos` (OUTBOX_CHAOS_MESSAGES=1000); `go test ./chaos/`
// runs OUTBOX_CHAOS_MESSAGES (default 100) messages per fault.
package chaos
