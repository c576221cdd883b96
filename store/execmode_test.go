package store_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
)

// TestEnqueueUnderEveryQueryExecMode enqueues through connections in each of pgx's query
// exec modes, the simple protocol and QueryExecModeExec among them (what a pool such as
// PgBouncer in transaction mode needs): every form of Enqueue and EnqueueBatch writes its
// row with the message ID it returns.
func TestEnqueueUnderEveryQueryExecMode(t *testing.T) {
	ctx := context.Background()
	pool, st := testdb.Schema(t)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			cfg, err := pgx.ParseConfig(testdb.URL())
			require.NoError(t, err)
			cfg.DefaultQueryExecMode = mode
			conn, err := pgx.ConnectConfig(ctx, cfg)
			require.NoError(t, err)
			defer conn.Close(ctx)
			tx, err := conn.Begin(ctx)
			require.NoError(t, err)
			var written []store.Enqueued
			for _, m := range []store.Message{
				msg("order.created", `{"n": 1}`),
				{Topic: "order.created", Payload: []byte(`{"n": 2}`), OrderingKey: "order-" + mode.String()},
				{Topic: "order.created", Payload: []byte(`{"n": 3}`), IdempotencyKey: "key-" + mode.String()},
			} {
				res, err := st.EnqueueMessage(ctx, tx, m)
				require.NoError(t, err, "%s: %+v", mode, m)
				written = append(written, res)
			}
			batch, err := st.EnqueueBatch(ctx, tx, []store.Message{
				msg("order.created", `{"n": 4}`),
				{Topic: "order.created", Payload: []byte(`{"n": 5}`), IdempotencyKey: "batch-key-" + mode.String()},
			})
			require.NoError(t, err, mode)
			require.NoError(t, tx.Commit(ctx))
			for _, res := range append(written, batch...) {
				require.Equal(t, 1, count(t, pool, st, "message_id = $1", res.MessageID), "%s: %s", mode, res.MessageID)
			}
		})
	}
}
