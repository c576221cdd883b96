package mysqlstore_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/store/mysqlstore"
	"github.com/outbox-go/outbox/store/storedriver"
)

// defaultURL is the server the tests use when TEST_MYSQL_URL is not set.
const defaultURL = "mysql://root@127.0.0.1:3306/test"

func serverURL() string { return cmp.Or(os.Getenv("TEST_MYSQL_URL"), defaultURL) }

// newDatabase creates an empty database with a random name, drops it when the test ends,
// and returns a DSN that connects to it.
func newDatabase(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	admin, err := mysqlstore.Open(ctx, serverURL())
	require.NoError(t, err, "MySQL at %s (set TEST_MYSQL_URL)", serverURL())
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "outbox_test_" + hex.EncodeToString(b)
	_, err = admin.ExecContext(ctx, "CREATE DATABASE "+name+" CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := admin.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+name)
		if err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
		_ = admin.Close()
	})
	cfg, err := mysqlstore.ParseURL(serverURL())
	require.NoError(t, err)
	cfg.DBName = name
	return cfg.FormatDSN()
}

// openDB opens dsn with Open and closes it when the test ends.
func openDB(t testing.TB, dsn string) *sql.DB {
	t.Helper()
	db, err := mysqlstore.Open(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// newStore returns a store on a fresh, migrated database, and that database.
func newStore(t testing.TB) (*mysqlstore.Store, *sql.DB) {
	t.Helper()
	db := openDB(t, newDatabase(t))
	st, err := mysqlstore.New(db, mysqlstore.Config{})
	require.NoError(t, err)
	_, err = st.Migrate(context.Background())
	require.NoError(t, err)
	return st, db
}

// enqueue enqueues msg in a transaction of its own.
func enqueue(t testing.TB, st *mysqlstore.Store, db *sql.DB, msg storedriver.Message) storedriver.Enqueued {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	res, err := st.EnqueueMessage(ctx, tx, msg)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	return res
}

func msg(topic, payload string) storedriver.Message {
	return storedriver.Message{Topic: topic, Payload: []byte(payload)}
}

func keyed(topic, key, payload string) storedriver.Message {
	return storedriver.Message{Topic: topic, Payload: []byte(payload), OrderingKey: key}
}

func mustExec(t testing.TB, db *sql.DB, query string, args ...any) {
	t.Helper()
	_, err := db.ExecContext(context.Background(), query, args...)
	require.NoError(t, err, query)
}

func status(t testing.TB, st *mysqlstore.Store, id interface{ String() string }) storedriver.Status {
	t.Helper()
	var s string
	require.NoError(t, st.DB().QueryRowContext(context.Background(), `SELECT status FROM outbox_messages WHERE message_id = ?`, id.String()).Scan(&s))
	return storedriver.Status(s)
}

func claimAll(t testing.TB, st *mysqlstore.Store, rules storedriver.OrderingRules) []storedriver.Claimed {
	t.Helper()
	res, err := st.ClaimBatch(context.Background(), 1000, time.Minute, rules)
	require.NoError(t, err)
	return res.Claimed
}
