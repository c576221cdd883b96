// Package storetest is the conformance suite every outbox store implementation must pass:
// the same cases run against PostgreSQL (package store) and MySQL/MariaDB (package
// mysqlstore), each against its real server. A store for another database runs it too:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, storetest.Harness{New: newTarget})
//	}
//
// where newTarget creates an isolated, migrated database (or schema) for one test and
// removes it when the test ends.
package storetest

import (
	"context"
	"testing"

	"github.com/outbox-go/outbox/store/storedriver"
)

// Harness creates the targets the suite runs against.
type Harness struct {
	// New returns a Target on a fresh, migrated, empty database or schema that no other
	// test uses; it registers the clean-up with t.Cleanup.
	New func(t *testing.T) Target
}

// Target is one isolated store under test and the database-specific ways to write to it.
type Target struct {
	// Driver is the store under test.
	Driver storedriver.Driver
	// InTx runs fn in a transaction of the database and commits it when fn returns nil,
	// rolls it back otherwise. Enqueue inside fn joins that transaction: this is the
	// business code's one call.
	InTx func(ctx context.Context, fn func(enqueue Enqueue) error) error
	// InsertSQL inserts a row the way a writer without the library does: plain SQL naming
	// only the given columns (topic and payload, optionally status, retry_times,
	// max_retry_times, next_retry_at, ordering_key), with values as the database's
	// client would send them (payload as JSON text, next_retry_at as a time.Time).
	InsertSQL func(ctx context.Context, columns map[string]any) error
	// Exec runs one statement in the database's own dialect, for the few cases that must
	// put a row in a state no public call makes (a lease that has run out). The suite
	// names the outbox tables without a schema: the target's connection resolves them.
	Exec func(ctx context.Context, sql string, args ...any) error
	// Dialect is "postgres" or "mysql": which spelling of Exec's statements to use.
	Dialect string
}

// Enqueue enqueues one message in the transaction InTx runs.
type Enqueue func(ctx context.Context, msg storedriver.Message) (storedriver.Enqueued, error)
