package mysqlstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/outbox-go/outbox/store/storedriver"
	"github.com/outbox-go/outbox/store/storedriver/storetest"
)

// TestConformance runs the conformance suite every store implementation passes against
// the MySQL store, each case on a database of its own.
func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, storetest.Harness{New: newMySQLTarget})
}

// conformanceColumns are the columns storetest's InsertSQL may name.
var conformanceColumns = []string{"topic", "payload", "status", "retry_times", "max_retry_times", "next_retry_at", "ordering_key"}

func newMySQLTarget(t *testing.T) storetest.Target {
	st, db := newStore(t)
	return storetest.Target{
		Driver: st,
		InTx: func(ctx context.Context, fn func(enqueue storetest.Enqueue) error) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback() }()
			if err := fn(func(ctx context.Context, msg storedriver.Message) (storedriver.Enqueued, error) {
				return st.EnqueueMessage(ctx, tx, msg)
			}); err != nil {
				return err
			}
			return tx.Commit()
		},
		InsertSQL: func(ctx context.Context, columns map[string]any) error {
			names := make([]string, 0, len(columns))
			for name := range columns {
				if !slices.Contains(conformanceColumns, name) {
					return fmt.Errorf("InsertSQL: unexpected column %q", name)
				}
				names = append(names, name)
			}
			slices.Sort(names)
			args := make([]any, len(names))
			for i, name := range names {
				args[i] = textValue(columns[name])
			}
			_, err := db.ExecContext(ctx, fmt.Sprintf(`INSERT INTO outbox_messages (%s) VALUES (%s)`,
				strings.Join(names, ", "), strings.TrimSuffix(strings.Repeat("?, ", len(names)), ", ")), args...)
			return err
		},
		// The connection's database is the test's: statements name the tables alone.
		Exec: func(ctx context.Context, query string, args ...any) error {
			_, err := db.ExecContext(ctx, query, args...)
			return err
		},
		Dialect: "mysql",
	}
}

// textValue sends JSON as text: MySQL's JSON type refuses a binary string, which is how the
// driver sends a []byte.
func textValue(v any) any {
	switch v := v.(type) {
	case json.RawMessage:
		return string(v)
	case []byte:
		return string(v)
	}
	return v
}
