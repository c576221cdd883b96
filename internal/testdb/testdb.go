// Package testdb gives each test its own PostgreSQL schema with the outbox tables in it.
package testdb

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/outboxtest"
	"github.com/outbox-go/outbox/store"
)

// DefaultURL is the database the tests use when TEST_DATABASE_URL is not set: the local
// PostgreSQL that scripts/services.sh starts.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// URL returns the connection string of the test database.
func URL() string { return cmp.Or(os.Getenv("TEST_DATABASE_URL"), DefaultURL) }

// Pool connects to the test database; the pool is closed when the test ends.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), URL())
	require.NoError(t, err)
	require.NoError(t, pool.Ping(context.Background()), "PostgreSQL at %s (set TEST_DATABASE_URL, or run scripts/services.sh)", URL())
	t.Cleanup(pool.Close)
	return pool
}

// Schema creates a fresh, migrated schema with a random name and drops it when the test
// ends. It returns the pool and a Store on that schema. It is outboxtest.Schema, the helper
// teams use, on the test database.
func Schema(t testing.TB) (*pgxpool.Pool, *store.Store) {
	t.Helper()
	return outboxtest.Schema(t, URL())
}

// EachUnmigrated runs test, as a parallel subtest, on a fresh schema of each kind that
// answers that the outbox's migrations have not run (store.ErrNotMigrated): one without
// the deployment table, one without its row.
func EachUnmigrated(t *testing.T, test func(t *testing.T, pool *pgxpool.Pool, st *store.Store)) {
	t.Helper()
	for name, ddl := range map[string]string{
		"NoDeploymentTable": `DROP TABLE %s.outbox_deployment`,
		"NoDeploymentRow":   `DELETE FROM %s.outbox_deployment`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool, st := Schema(t)
			_, err := pool.Exec(context.Background(), fmt.Sprintf(ddl, st.Schema()))
			require.NoError(t, err)
			test(t, pool, st)
		})
	}
}
