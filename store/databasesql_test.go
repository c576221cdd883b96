package store_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/store/storedriver/storetest"
)

// TestConformanceDatabaseSQL runs the conformance suite with the business code on
// database/sql: every enqueue joins a *sql.Tx of pgx's stdlib driver through store.SQLTx.
func TestConformanceDatabaseSQL(t *testing.T) {
	t.Parallel()
	storetest.Run(t, storetest.Harness{New: func(t *testing.T) storetest.Target {
		target, pool, st := postgresTarget(t)
		db := stdlib.OpenDBFromPool(pool)
		t.Cleanup(func() { _ = db.Close() })
		target.InTx = func(ctx context.Context, fn func(enqueue storetest.Enqueue) error) error {
			return inSQLTx(ctx, db, func(tx *sql.Tx) error {
				return fn(func(ctx context.Context, msg store.Message) (store.Enqueued, error) {
					return st.EnqueueMessage(ctx, store.SQLTx(tx), msg)
				})
			})
		}
		return target
	}})
}

// inSQLTx runs fn in a transaction of db, committed when fn returns nil.
func inSQLTx(ctx context.Context, db *sql.DB, fn func(tx *sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// TestSQLTxEnqueueBatch: EnqueueBatch on a *sql.Tx writes the rows EnqueueBatch on pgx
// writes (keys numbered in batch order, headers, delays, retry limits, idempotency keys
// held by earlier rows and by the batch itself), and a rollback writes nothing.
func TestSQLTxEnqueueBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, st := testdb.Schema(t)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() })

	held, err := st.Enqueue(ctx, pool, store.Message{Topic: "order.created", Payload: []byte(`{}`), IdempotencyKey: `held "key" \ one`})
	require.NoError(t, err)

	// Nanoseconds past a microsecond, from a time zone of its own: stored cut to the
	// microsecond, as pgx sends it, not rounded up by the server.
	after := time.Now().Add(time.Hour).Truncate(time.Microsecond).Add(999 * time.Nanosecond).In(time.FixedZone("UTC+5:30", 19800))
	three := 3
	msgs := []store.Message{
		keyed("k", 1),
		{Topic: "order.created", Payload: []byte(`{"a": "quote \" and backslash \\"}`), Headers: map[string]string{"tenant": "acme, inc"}, MaxRetryTimes: &three},
		{Topic: "order.created", Payload: []byte(`{}`), DeliverAfter: after, IdempotencyKey: "new"},
		{Topic: "order.created", Payload: []byte(`{}`), IdempotencyKey: "new"},
		{Topic: "order.created", Payload: []byte(`{}`), IdempotencyKey: `held "key" \ one`},
		keyed("k", 2),
	}
	var res []store.Enqueued
	require.NoError(t, inSQLTx(ctx, db, func(tx *sql.Tx) error {
		res, err = st.EnqueueBatch(ctx, store.SQLTx(tx), msgs)
		return err
	}))
	require.Len(t, res, len(msgs))
	require.Less(t, res[0].OrderingSeq, res[5].OrderingSeq, "a key's messages are numbered in batch order")
	require.Equal(t, store.Enqueued{MessageID: res[2].MessageID, Duplicate: true}, res[3], "the batch's own key")
	require.Equal(t, store.Enqueued{MessageID: held, Duplicate: true}, res[4], "a key an earlier row holds")

	row, err := st.Get(ctx, res[1].MessageID)
	require.NoError(t, err)
	require.JSONEq(t, string(msgs[1].Payload), string(row.Payload))
	require.Equal(t, "acme, inc", row.Headers["tenant"])
	require.Equal(t, &three, row.MaxRetryTimes)
	row, err = st.Get(ctx, res[2].MessageID)
	require.NoError(t, err)
	require.NotNil(t, row.NextRetryAt)
	require.True(t, after.Truncate(time.Microsecond).Equal(*row.NextRetryAt), "%s, want %s", row.NextRetryAt, after)
	require.Equal(t, 5, count(t, pool, st, "true"), "the held row and the batch's four new ones")

	// A rolled-back transaction leaves no row.
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	id, err := st.Enqueue(ctx, store.SQLTx(tx), msg("order.created", `{}`))
	require.NoError(t, err)
	_, err = st.EnqueueBatch(ctx, store.SQLTx(tx), []store.Message{keyed("k", 3)})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback())
	_, err = st.Get(ctx, id)
	require.ErrorIs(t, err, store.ErrNotFound)
	require.Equal(t, 5, count(t, pool, st, "true"))
}

// TestSQLTxEnqueueJSON: EnqueueJSON takes a *sql.Tx too, and a second enqueue of an
// idempotency key in a later transaction returns the first row.
func TestSQLTxEnqueueJSON(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, st := testdb.Schema(t)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() })

	var res store.Enqueued
	require.NoError(t, inSQLTx(ctx, db, func(tx *sql.Tx) error {
		var err error
		res, err = st.EnqueueJSON(ctx, store.SQLTx(tx), store.Message{Topic: "order.created", IdempotencyKey: "order-42"}, map[string]any{"order": 42})
		return err
	}))
	require.NoError(t, inSQLTx(ctx, db, func(tx *sql.Tx) error {
		again, err := st.EnqueueJSON(ctx, store.SQLTx(tx), store.Message{Topic: "order.created", IdempotencyKey: "order-42"}, map[string]any{"order": 42})
		require.Equal(t, store.Enqueued{MessageID: res.MessageID, Duplicate: true}, again)
		return err
	}))
	row, err := st.Get(ctx, res.MessageID)
	require.NoError(t, err)
	var payload map[string]int
	require.NoError(t, json.Unmarshal(row.Payload, &payload))
	require.Equal(t, 42, payload["order"])
}
