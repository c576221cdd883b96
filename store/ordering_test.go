package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
)

func keyed(key string, n int) store.Message {
	return store.Message{Topic: "order.event", OrderingKey: key, Payload: json.RawMessage(fmt.Sprintf(`{"n": %d}`, n))}
}

// TestOrderingIsolation: an ordered Enqueue in a business transaction at REPEATABLE READ
// or SERIALIZABLE succeeds although another writer of the key committed after its
// snapshot, and the key's numbers still follow commit order.
func TestOrderingIsolation(t *testing.T) {
	t.Parallel()
	for _, level := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		t.Run(string(level), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool, st := testdb.Schema(t)
			tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: level})
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = tx.Exec(ctx, `SELECT count(*) FROM `+st.Schema()+`.outbox_messages`) // the snapshot
			require.NoError(t, err)

			first, err := st.EnqueueMessage(ctx, pool, keyed("order-1", 1)) // commits after the snapshot
			require.NoError(t, err)
			second, err := st.EnqueueMessage(ctx, tx, keyed("order-1", 2))
			require.NoError(t, err, "no serialization failure for a key another writer used")
			require.NoError(t, tx.Commit(ctx))
			require.Less(t, first.OrderingSeq, second.OrderingSeq)
		})
	}
}

// TestOrderingDeadlock: two transactions that enqueue keys A,B and B,A one message at a
// time deadlock, and the one PostgreSQL aborts gets an error that says what to do; with
// EnqueueBatch the same two transactions never deadlock.
func TestOrderingDeadlock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("OneAtATimeIsExplained", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		tx1, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx1.Rollback(ctx) }()
		tx2, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx2.Rollback(ctx) }()
		_, err = st.Enqueue(ctx, tx1, keyed("A", 1))
		require.NoError(t, err)
		_, err = st.Enqueue(ctx, tx2, keyed("B", 1))
		require.NoError(t, err)

		type result struct {
			tx  pgx.Tx
			err error
		}
		var tx1PID int32
		require.NoError(t, tx1.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&tx1PID))
		results := make(chan result, 2)
		go func() { _, err := st.Enqueue(ctx, tx1, keyed("B", 2)); results <- result{tx1, err} }() // waits for tx2
		// Once tx1 waits for B's lock, close the cycle.
		require.Eventually(t, func() bool {
			var waiting bool
			require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`, tx1PID).Scan(&waiting))
			return waiting
		}, 10*time.Second, 5*time.Millisecond, "tx1 never waited for key B's lock")
		go func() { _, err := st.Enqueue(ctx, tx2, keyed("A", 2)); results <- result{tx2, err} }()
		var failed []error
		for range 2 {
			r := <-results
			if r.err != nil {
				failed = append(failed, r.err)
				require.NoError(t, r.tx.Rollback(ctx)) // the aborted one ends; the other goes on
			}
		}
		require.Len(t, failed, 1, "PostgreSQL aborts exactly one of the two")
		require.ErrorIs(t, failed[0], store.ErrOrderingDeadlock)
		require.ErrorContains(t, failed[0], "EnqueueBatch")
		var pgErr *pgconn.PgError
		require.ErrorAs(t, failed[0], &pgErr)
		require.Equal(t, "40P01", pgErr.Code)
	})

	t.Run("BatchesNeverDeadlock", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		var wg sync.WaitGroup
		errs := make(chan error, 40)
		for i := range 40 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				batch := []store.Message{keyed("A", i), keyed("B", i), keyed("C", i)}
				if i%2 == 1 {
					batch = []store.Message{keyed("C", i), keyed("B", i), keyed("A", i)}
				}
				errs <- pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := st.EnqueueBatch(ctx, tx, batch)
					return err
				})
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		require.Equal(t, 120, count(t, pool, st, "ordering_key IS NOT NULL"))
	})
}

func TestEnqueueBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, st := testdb.Schema(t)

	res, err := st.EnqueueBatch(ctx, pool, []store.Message{keyed("k", 1), msg("plain", `{"a": 1}`), keyed("k", 2)})
	require.NoError(t, err)
	require.Len(t, res, 3)
	require.Less(t, res[0].OrderingSeq, res[2].OrderingSeq, "a key's messages are numbered in batch order")
	require.Zero(t, res[1].OrderingSeq)
	for i, r := range res {
		row, err := st.Get(ctx, r.MessageID)
		require.NoError(t, err, "message %d", i)
		require.Equal(t, store.StatusPending, row.Status)
	}

	// A bad message names its index and writes nothing.
	_, err = st.EnqueueBatch(ctx, pool, []store.Message{msg("ok", `{}`), msg("Bad Topic", `{}`)})
	var verr *store.ValidationError
	require.True(t, errors.As(err, &verr), "%v", err)
	require.Equal(t, "messages[1].topic", verr.Field)
	require.Equal(t, 0, count(t, pool, st, "topic = 'ok'"))

	empty, err := st.EnqueueBatch(ctx, pool, nil)
	require.NoError(t, err)
	require.Empty(t, empty)
}

// TestClaimParksHeldBackRows: a keyed row held back behind an earlier message of its key
// is parked by the claim (off its path), unparked when the earlier message is sent, and
// the sweep unparks a row whose key no longer holds it under changed rules.
func TestClaimParksHeldBackRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, st := testdb.Schema(t)
	held := func(id uuid.UUID) bool {
		var h bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT held_back FROM `+st.Schema()+`.outbox_messages WHERE message_id = $1`, id).Scan(&h))
		return h
	}
	enqueue := func(n int) uuid.UUID {
		id, err := st.Enqueue(ctx, pool, keyed("k", n))
		require.NoError(t, err)
		return id
	}
	first, second, third := enqueue(1), enqueue(2), enqueue(3)

	res, err := st.ClaimBatch(ctx, 10, time.Minute, store.OrderingRules{})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 1)
	require.Equal(t, first, res.Claimed[0].MessageID)
	require.Equal(t, 2, res.Parked)
	require.True(t, held(second))
	require.True(t, held(third))

	// Nothing is due while the first is in flight; the parked rows are not looked at.
	res, err = st.ClaimBatch(ctx, 10, time.Minute, store.OrderingRules{})
	require.NoError(t, err)
	require.Empty(t, res.Claimed)
	require.Zero(t, res.Parked)

	// The first is sent: the release trigger unparks the second (only).
	_, err = st.MarkSent(ctx, first)
	require.NoError(t, err)
	require.False(t, held(second))
	require.True(t, held(third))
	res, err = st.ClaimBatch(ctx, 10, time.Minute, store.OrderingRules{})
	require.NoError(t, err)
	require.Len(t, res.Claimed, 1)
	require.Equal(t, second, res.Claimed[0].MessageID)

	// The second is dead and blocks its key; a change of rules (dead letters of the
	// topic no longer block) is picked up by the sweep.
	_, err = st.DeadLetter(ctx, store.DeadLetter{MessageID: second, WorkflowID: "w", RunID: "r", Attempts: 1, LastError: "x"})
	require.NoError(t, err)
	res, err = st.ClaimBatch(ctx, 10, time.Minute, store.OrderingRules{})
	require.NoError(t, err)
	require.Empty(t, res.Claimed)
	require.True(t, held(third), "parked again behind the dead message")
	skipping := store.OrderingRules{DefaultSkipping: true}
	n, err := st.Unpark(ctx, skipping)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	res, err = st.ClaimBatch(ctx, 10, time.Minute, skipping)
	require.NoError(t, err)
	require.Len(t, res.Claimed, 1)
	require.Equal(t, third, res.Claimed[0].MessageID)
}
