package store_test

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/outboxtest"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/store/storedriver/storetest"
)

// TestConformance runs the conformance suite every store implementation passes against
// the PostgreSQL store, each case on a schema of its own.
func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, storetest.Harness{New: newPostgresTarget})
}

// TestConformanceUnderPoolerExecModes runs the suite again with every connection of the
// store's pool in the query exec modes a pool such as PgBouncer in transaction mode
// needs (a DATABASE_URL with default_query_exec_mode=simple_protocol or exec): the
// relay's and the worker's own statements, not only Enqueue, encode their arguments in
// them.
func TestConformanceUnderPoolerExecModes(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"simple_protocol", "exec"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			u, err := url.Parse(testdb.URL())
			require.NoError(t, err)
			q := u.Query()
			q.Set("default_query_exec_mode", mode)
			u.RawQuery = q.Encode()
			storetest.Run(t, storetest.Harness{New: func(t *testing.T) storetest.Target {
				target, _, _ := postgresTargetAt(t, u.String())
				return target
			}})
		})
	}
}

// insertColumns are the columns storetest's InsertSQL may name.
var insertColumns = []string{"topic", "payload", "status", "retry_times", "max_retry_times", "next_retry_at", "ordering_key"}

func newPostgresTarget(t *testing.T) storetest.Target {
	target, _, _ := postgresTarget(t)
	return target
}

// postgresTarget is the PostgreSQL store on a schema of its own, with the business code
// on pgx, and the pool and store it uses.
func postgresTarget(t *testing.T) (storetest.Target, *pgxpool.Pool, *store.Store) {
	return postgresTargetAt(t, testdb.URL())
}

// postgresTargetAt is postgresTarget on the database at dbURL.
func postgresTargetAt(t *testing.T, dbURL string) (storetest.Target, *pgxpool.Pool, *store.Store) {
	pool, st := outboxtest.Schema(t, dbURL)
	messages := pgx.Identifier{st.Schema(), "outbox_messages"}.Sanitize()
	return storetest.Target{
		Driver: st,
		InTx: func(ctx context.Context, fn func(enqueue storetest.Enqueue) error) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				return fn(func(ctx context.Context, msg store.Message) (store.Enqueued, error) {
					return st.EnqueueMessage(ctx, tx, msg)
				})
			})
		},
		InsertSQL: func(ctx context.Context, columns map[string]any) error {
			names := make([]string, 0, len(columns))
			for name := range columns {
				if !slices.Contains(insertColumns, name) {
					return fmt.Errorf("InsertSQL: unexpected column %q", name)
				}
				names = append(names, name)
			}
			slices.Sort(names)
			params := make([]string, len(names))
			args := make([]any, len(names))
			for i, name := range names {
				params[i], args[i] = fmt.Sprintf("$%d", i+1), columns[name]
			}
			_, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (%s) VALUES (%s)`,
				messages, strings.Join(names, ", "), strings.Join(params, ", ")), args...)
			return err
		},
		// Statements name the tables without a schema: they run with the test's schema
		// alone on the search_path, in a transaction of their own.
		Exec: func(ctx context.Context, sql string, args ...any) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `SELECT set_config('search_path', $1, true)`, pgx.Identifier{st.Schema()}.Sanitize()); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, sql, args...)
				return err
			})
		},
		Dialect: "postgres",
	}, pool, st
}
