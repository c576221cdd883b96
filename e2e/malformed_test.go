package e2e

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/store"
)

// TestMalformedRows inserts rows the way another program might, with plain SQL and no
// validation: each bad row is rejected by a constraint or dead-lettered with a clear
// reason, none stops the worker or relay, and a healthy row inserted alongside them is
// delivered.
func TestMalformedRows(t *testing.T) {
	t.Parallel()
	ts := newServer(t)
	e := newEnv(t, ts)
	e.startWorker(t)
	e.startRelay(t)
	ctx := context.Background()
	table := e.store.Schema() + ".outbox_messages"

	insert := func(columns, values string) (uuid.UUID, error) {
		var id uuid.UUID
		err := e.pool.QueryRow(ctx, fmt.Sprintf(`INSERT INTO %s (%s) VALUES (%s) RETURNING message_id`, table, columns, values)).Scan(&id)
		return id, err
	}
	mustInsert := func(t *testing.T, columns, values string) uuid.UUID {
		t.Helper()
		id, err := insert(columns, values)
		require.NoError(t, err)
		return id
	}

	t.Run("RejectedByConstraints", func(t *testing.T) {
		for _, tc := range []struct {
			name, columns, values, constraint string
		}{
			{"EmptyTopic", "topic, payload", `'', '{}'`, "outbox_messages_topic_check"},
			{"MaxRetryTimesNegative", "topic, payload, max_retry_times", `'order.created', '{}', -1`, "outbox_messages_max_retry_times_check"},
			{"MaxRetryTimesOver100", "topic, payload, max_retry_times", `'order.created', '{}', 101`, "outbox_messages_max_retry_times_check"},
			{"StatusTypo", "topic, payload, status", `'order.created', '{}', 'pendng'`, "outbox_messages_status_check"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, err := insert(tc.columns, tc.values)
				var pgErr *pgconn.PgError
				require.True(t, errors.As(err, &pgErr), "want a PostgreSQL error, got %v", err)
				require.Equal(t, "23514", pgErr.Code, "check_violation")
				require.Equal(t, tc.constraint, pgErr.ConstraintName)
			})
		}
		var n int
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n))
		require.Zero(t, n, "nothing was written")
	})

	// Rows the constraints accept. The bad ones go in first, so the healthy one is claimed
	// behind them.
	huge := mustInsert(t, "topic, payload", `'order.created', jsonb_build_object('blob', repeat('x', 3 * 1024 * 1024))`)
	// An unknown topic is retried through its attempts (two here) before it is dead-lettered.
	unknown := mustInsert(t, "topic, payload, max_retry_times", `'order.unknown', '{"k": 1}', 1`)
	stringPayload := mustInsert(t, "topic, payload", `'order.created', '"just a string"'`)
	numberPayload := mustInsert(t, "topic, payload", `'order.created', '42'`)
	arrayHeaders := mustInsert(t, "topic, payload, headers", `'order.created', '{"k": 2}', '["traceparent", "00-abc"]'`)
	healthy := mustInsert(t, "topic, payload", `'order.created', '{"order": 1}'`)

	t.Run("HealthyRowDelivered", func(t *testing.T) {
		e.waitStatus(t, healthy, store.StatusSent)
		requests, effects := e.recv.Count(healthy.String())
		require.Equal(t, 1, requests)
		require.Equal(t, 1, effects)
	})

	t.Run("NonObjectPayloadsDelivered", func(t *testing.T) {
		for _, id := range []uuid.UUID{stringPayload, numberPayload} {
			e.waitStatus(t, id, store.StatusSent)
			requests, _ := e.recv.Count(id.String())
			require.Equal(t, 1, requests, "message %s", id)
		}
		row, err := e.store.Get(ctx, stringPayload)
		require.NoError(t, err)
		require.JSONEq(t, `"just a string"`, string(row.Payload))
	})

	t.Run("ArrayHeadersIgnored", func(t *testing.T) {
		e.waitStatus(t, arrayHeaders, store.StatusSent)
		row, err := e.store.Get(ctx, arrayHeaders)
		require.NoError(t, err)
		require.Nil(t, row.Headers)
		requests, _ := e.recv.Count(arrayHeaders.String())
		require.Equal(t, 1, requests)
	})

	t.Run("HugePayloadDeadLetteredWithSizeLimit", func(t *testing.T) {
		e.waitStatus(t, huge, store.StatusDead)
		requests, _ := e.recv.Count(huge.String())
		require.Zero(t, requests, "an oversized payload is never sent")
		dls, err := e.store.DeadLetters(ctx, huge)
		require.NoError(t, err)
		require.Len(t, dls, 1)
		require.Equal(t, 1, dls[0].Attempts, "a permanent failure: no retries")
		require.Contains(t, dls[0].LastError, "permanent failure")
		require.Contains(t, dls[0].LastError, fmt.Sprintf("over the payload size limit of %d bytes", e.store.MaxPayloadBytes()))
	})

	t.Run("UnknownTopicDeadLettered", func(t *testing.T) {
		e.waitStatus(t, unknown, store.StatusDead)
		dls, err := e.store.DeadLetters(ctx, unknown)
		require.NoError(t, err)
		require.Len(t, dls, 1)
		require.Contains(t, dls[0].LastError, `no handler for topic "order.unknown"`)
	})
}
