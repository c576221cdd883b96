// Package testdb gives each test its own PostgreSQL schema with the outbox tables in it.
package testdb

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

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
// ends. It returns the pool and a Store on that schema.
func Schema(t testing.TB) (*pgxpool.Pool, *store.Store) {
	t.Helper()
	pool := Pool(t)
	schema := fmt.Sprintf("outbox_test_%08x", rand.Uint32())
	st, err := store.New(pool, store.Config{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`)
		if err != nil {
			t.Errorf("drop test schema %s: %v", schema, err)
		}
	})
	_, err = st.Migrate(context.Background())
	require.NoError(t, err)
	return pool, st
}
