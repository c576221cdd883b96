package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
)

// TestEnqueueUnderEveryQueryExecMode enqueues through connections in each of pgx's query
// exec modes, the simple protocol and QueryExecModeExec among them (what a pool such as
// PgBouncer in transaction mode needs): every form of Enqueue and EnqueueBatch writes its
// row, headers, trace context, retries and delivery time included, with the message ID it
// returns, and leaves the caller's transaction usable.
func TestEnqueueUnderEveryQueryExecMode(t *testing.T) {
	ctx := context.Background()
	_, st := testdb.Schema(t)
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
			// Every optional column set, on each path (plain, ordered, idempotent, batch),
			// under a span whose trace context joins the headers.
			retries := 3
			due := time.Date(2026, 12, 24, 18, 0, 0, 123456000, time.UTC)
			full := func(n int) store.Message {
				return store.Message{Topic: "order.created", Payload: []byte(fmt.Sprintf(`{"n": %d}`, n)),
					Headers: map[string]string{"tenant": "t-1", "quote": `it's "x" \ y`}, MaxRetryTimes: &retries, DeliverAfter: due}
			}
			sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled})
			spanCtx := trace.ContextWithSpanContext(ctx, sc)
			ordered, idempotent, batchIdempotent := full(2), full(3), full(5)
			ordered.OrderingKey, idempotent.IdempotencyKey, batchIdempotent.IdempotencyKey = "order-"+mode.String(), "key-"+mode.String(), "batch-key-"+mode.String()
			var written []store.Enqueued
			for _, m := range []store.Message{full(1), ordered, idempotent} {
				res, err := st.EnqueueMessage(spanCtx, tx, m)
				require.NoError(t, err, "%s: %+v", mode, m)
				written = append(written, res)
			}
			batch, err := st.EnqueueBatch(spanCtx, tx, []store.Message{full(4), batchIdempotent})
			require.NoError(t, err, mode)
			var one int
			require.NoError(t, tx.QueryRow(ctx, "SELECT 1").Scan(&one), "the business transaction goes on")
			require.NoError(t, tx.Commit(ctx))
			for _, res := range append(written, batch...) {
				row, err := st.Get(ctx, res.MessageID)
				require.NoError(t, err, "%s: %s", mode, res.MessageID)
				require.Equal(t, map[string]string{"tenant": "t-1", "quote": `it's "x" \ y`,
					"traceparent": "00-01000000000000000000000000000000-0200000000000000-01"}, row.Headers, mode)
				require.Equal(t, &retries, row.MaxRetryTimes, mode)
				require.NotNil(t, row.NextRetryAt, mode)
				require.True(t, due.Equal(*row.NextRetryAt), "%s: %s", mode, row.NextRetryAt)
			}
		})
	}
}
