package e2e

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
)

// TestDatabaseSQLDelivery: business code on database/sql with lib/pq, the driver many
// PostgreSQL teams still run, enqueues in its own *sql.Tx through store.SQLTx: committed
// messages (one by one and in a batch with ordering and idempotency keys) are delivered
// through a real Temporal server, a rolled-back one never is, and two transactions that
// take ordering keys in opposite orders get ErrOrderingDeadlock with lib/pq's error inside.
func TestDatabaseSQLDelivery(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	e := newEnv(t, ts)
	e.createOrders(t)
	ctx := context.Background()
	db, err := sql.Open("postgres", testdb.URL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	orders := e.store.Schema() + ".orders"

	// placeOrder writes order n and its messages in one transaction of db, committed when
	// commit is true.
	placeOrder := func(n int, commit bool) []uuid.UUID {
		t.Helper()
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }()
		_, err = tx.ExecContext(ctx, `INSERT INTO `+orders+` (n) VALUES ($1)`, n)
		require.NoError(t, err)
		payload := json.RawMessage(fmt.Sprintf(`{"order": %d}`, n))
		id, err := e.store.Enqueue(ctx, store.SQLTx(tx), store.Message{Topic: "order.created", Payload: payload, Headers: map[string]string{"tenant": "acme"}})
		require.NoError(t, err)
		batch, err := e.store.EnqueueBatch(ctx, store.SQLTx(tx), []store.Message{
			{Topic: "order.created", Payload: payload, OrderingKey: fmt.Sprintf("order-%d", n)},
			{Topic: "order.created", Payload: payload, OrderingKey: fmt.Sprintf("order-%d", n), IdempotencyKey: fmt.Sprintf("order-%d-paid", n)},
			{Topic: "order.created", Payload: payload, IdempotencyKey: fmt.Sprintf("order-%d-paid", n)},
		})
		require.NoError(t, err)
		require.True(t, batch[2].Duplicate, "the batch's third message repeats the second's idempotency key")
		if commit {
			require.NoError(t, tx.Commit())
		}
		return []uuid.UUID{id, batch[0].MessageID, batch[1].MessageID}
	}
	var delivered []uuid.UUID
	for n := range 5 {
		delivered = append(delivered, placeOrder(n, true)...)
	}
	rolledBack := placeOrder(99, false)

	e.startWorker(t)
	e.startRelay(t)
	for _, id := range delivered {
		e.waitStatus(t, id, store.StatusSent)
		requests, effects := e.recv.Count(id.String())
		require.Equal(t, 1, effects, "message %s reached the downstream once", id)
		require.GreaterOrEqual(t, requests, 1)
	}
	for _, id := range rolledBack {
		_, err := e.store.Get(ctx, id)
		require.ErrorIs(t, err, store.ErrNotFound, "a rolled-back message has no row")
		requests, _ := e.recv.Count(id.String())
		require.Zero(t, requests)
	}
	row, err := e.store.Get(ctx, delivered[0])
	require.NoError(t, err)
	require.Equal(t, "acme", row.Headers["tenant"])

	t.Run("OrderingDeadlock", func(t *testing.T) {
		tx1, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer func() { _ = tx1.Rollback() }()
		tx2, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer func() { _ = tx2.Rollback() }()
		keyed := func(key string) store.Message {
			return store.Message{Topic: "order.created", Payload: json.RawMessage(`{}`), OrderingKey: key}
		}
		_, err = e.store.Enqueue(ctx, store.SQLTx(tx1), keyed("A"))
		require.NoError(t, err)
		_, err = e.store.Enqueue(ctx, store.SQLTx(tx2), keyed("B"))
		require.NoError(t, err)
		var tx1PID int
		require.NoError(t, tx1.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&tx1PID))

		type result struct {
			tx  *sql.Tx
			err error
		}
		results := make(chan result, 2)
		go func() { _, err := e.store.Enqueue(ctx, store.SQLTx(tx1), keyed("B")); results <- result{tx1, err} }() // waits for tx2
		require.Eventually(t, func() bool {
			var waiting bool
			require.NoError(t, db.QueryRowContext(ctx, `SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`, tx1PID).Scan(&waiting))
			return waiting
		}, 10*time.Second, 5*time.Millisecond, "tx1 never waited for key B's lock")
		go func() { _, err := e.store.Enqueue(ctx, store.SQLTx(tx2), keyed("A")); results <- result{tx2, err} }()

		// PostgreSQL aborts one of the two (the one whose deadlock check runs first, which
		// on a busy machine is not always tx1); the other goes on once the aborted one ends.
		// The driver may end the aborted transaction's session at once, so the other's
		// answer can come first.
		checkAborted := func(r result) {
			t.Helper()
			require.ErrorIs(t, r.err, store.ErrOrderingDeadlock)
			var pqErr *pq.Error
			require.ErrorAs(t, r.err, &pqErr)
			require.Equal(t, "40P01", pqErr.SQLState())
		}
		first := <-results
		if first.err != nil {
			checkAborted(first)
			_ = first.tx.Rollback()
			require.NoError(t, (<-results).err, "the other transaction went on once the aborted one ended")
		} else {
			checkAborted(<-results)
		}
	})
}
