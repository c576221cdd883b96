package store_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
)

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	msg := func(key string) store.Message {
		return store.Message{Topic: "order.created", Payload: json.RawMessage(`{"order_id": 42}`), IdempotencyKey: key}
	}
	count := func(t *testing.T, pool interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}, st *store.Store, key string) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+st.Schema()+`.outbox_messages WHERE idempotency_key = $1`, key).Scan(&n))
		return n
	}

	t.Run("SecondEnqueueIsADuplicateAndTheTransactionGoesOn", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		first, err := st.EnqueueMessage(ctx, pool, msg("order-42-created"))
		require.NoError(t, err)
		require.False(t, first.Duplicate)

		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			again, err := st.EnqueueMessage(ctx, tx, msg("order-42-created"))
			require.NoError(t, err)
			require.True(t, again.Duplicate)
			require.Equal(t, first.MessageID, again.MessageID, "the message that holds the key")
			// The business transaction is not aborted: it writes on and commits.
			other, err := st.EnqueueMessage(ctx, tx, msg("order-43-created"))
			require.NoError(t, err)
			require.False(t, other.Duplicate)
			return nil
		})
		require.NoError(t, err)
		require.Equal(t, 1, count(t, pool, st, "order-42-created"))
		require.Equal(t, 1, count(t, pool, st, "order-43-created"))

		// Messages without a key are never duplicates of each other.
		for range 2 {
			res, err := st.EnqueueMessage(ctx, pool, msg(""))
			require.NoError(t, err)
			require.False(t, res.Duplicate)
		}
	})

	t.Run("AWriterWaitsForTheFirstTransaction", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		for _, commit := range []bool{true, false} {
			key := "key-" + uuid.NewString()
			tx1, err := pool.Begin(ctx)
			require.NoError(t, err)
			first, err := st.EnqueueMessage(ctx, tx1, msg(key))
			require.NoError(t, err)
			done := make(chan store.Enqueued, 1)
			go func() {
				res, err := st.EnqueueMessage(ctx, pool, msg(key)) // waits for tx1
				require.NoError(t, err)
				done <- res
			}()
			select {
			case <-done:
				t.Fatal("the second writer did not wait for the first transaction")
			case <-time.After(200 * time.Millisecond):
			}
			if commit {
				require.NoError(t, tx1.Commit(ctx))
				res := <-done
				require.True(t, res.Duplicate, "the first committed: a duplicate")
				require.Equal(t, first.MessageID, res.MessageID)
			} else {
				require.NoError(t, tx1.Rollback(ctx))
				res := <-done
				require.False(t, res.Duplicate, "the first rolled back: the second writes")
			}
			require.Equal(t, 1, count(t, pool, st, key))
		}
	})

	t.Run("Batch", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		held, err := st.EnqueueMessage(ctx, pool, msg("a"))
		require.NoError(t, err)
		res, err := st.EnqueueBatch(ctx, pool, []store.Message{msg("a"), msg("b"), msg("b"), msg("")})
		require.NoError(t, err)
		require.Len(t, res, 4)
		require.True(t, res[0].Duplicate)
		require.Equal(t, held.MessageID, res[0].MessageID)
		require.False(t, res[1].Duplicate)
		require.True(t, res[2].Duplicate, "a key repeated in the batch is written once")
		require.Equal(t, res[1].MessageID, res[2].MessageID)
		require.False(t, res[3].Duplicate)
		require.Equal(t, 1, count(t, pool, st, "b"))
	})

	t.Run("InvalidKeysAreRefused", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		for _, key := range []string{"   ", "a\x00b", string(make([]byte, 201))} {
			_, err := st.EnqueueMessage(ctx, pool, msg(key))
			var verr *store.ValidationError
			require.ErrorAs(t, err, &verr)
			require.Equal(t, "idempotency_key", verr.Field)
			require.Contains(t, verr.Reason, "must be at most 200 bytes of text, not blank and without NUL")
		}
	})
}

func TestEnqueueJSON(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, st := testdb.Schema(t)
	type order struct {
		OrderID int64  `json:"order_id"`
		SKU     string `json:"sku"`
	}
	res, err := st.EnqueueJSON(ctx, pool, store.Message{Topic: "order.created", IdempotencyKey: "order-7-created"}, order{OrderID: 7, SKU: "SKU-1"})
	require.NoError(t, err)
	row, err := st.Get(ctx, res.MessageID)
	require.NoError(t, err)
	require.JSONEq(t, `{"order_id": 7, "sku": "SKU-1"}`, string(row.Payload))

	again, err := st.EnqueueJSON(ctx, pool, store.Message{Topic: "order.created", IdempotencyKey: "order-7-created"}, order{OrderID: 7})
	require.NoError(t, err)
	require.True(t, again.Duplicate)

	var verr *store.ValidationError
	_, err = st.EnqueueJSON(ctx, pool, store.Message{Topic: "order.created"}, make(chan int))
	require.ErrorAs(t, err, &verr)
	require.Equal(t, "payload", verr.Field)
	require.Contains(t, verr.Reason, "cannot be marshalled from a chan int")
	_, err = st.EnqueueJSON(ctx, pool, store.Message{Topic: "order.created", Payload: json.RawMessage(`{}`)}, order{})
	require.ErrorAs(t, err, &verr)
	require.Contains(t, verr.Reason, "leave Message.Payload empty")
}

// TestIdempotencyKeyAtRepeatableRead pins what the docs say of a transaction at
// REPEATABLE READ (or SERIALIZABLE) whose key another transaction committed after its
// snapshot: PostgreSQL reports a serialization failure (40001), not a duplicate, and the
// transaction is to be retried as a whole; retried, it reports the duplicate.
func TestIdempotencyKeyAtRepeatableRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, st := testdb.Schema(t)
	for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		key := "order-42-created-" + string(iso)
		tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
		require.NoError(t, err)
		var one int
		require.NoError(t, tx.QueryRow(ctx, "SELECT 1").Scan(&one)) // the snapshot
		holder, err := st.Enqueue(ctx, pool, store.Message{Topic: "order.created", Payload: json.RawMessage(`{}`), IdempotencyKey: key})
		require.NoError(t, err)
		_, err = st.EnqueueMessage(ctx, tx, store.Message{Topic: "order.created", Payload: json.RawMessage(`{}`), IdempotencyKey: key})
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, iso)
		require.Equal(t, "40001", pgErr.Code, iso)
		require.NoError(t, tx.Rollback(ctx))

		tx, err = pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
		require.NoError(t, err)
		res, err := st.EnqueueMessage(ctx, tx, store.Message{Topic: "order.created", Payload: json.RawMessage(`{}`), IdempotencyKey: key})
		require.NoError(t, err, "the retried transaction")
		require.Equal(t, store.Enqueued{MessageID: holder, Duplicate: true}, res)
		require.NoError(t, tx.Commit(ctx))
	}
}
