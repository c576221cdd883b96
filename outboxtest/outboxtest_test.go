package outboxtest_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/outbox-go/outbox/delivery"
	"github.com/outbox-go/outbox/outboxtest"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/workflows"
)

type order struct {
	ID  int64  `json:"order_id"`
	SKU string `json:"sku"`
}

// placeOrder is the code under test: an order's message, in the caller's transaction.
func placeOrder(ctx context.Context, tx pgx.Tx, st *store.Store, o order) error {
	_, err := st.EnqueueJSON(ctx, tx, store.Message{Topic: "order.created"}, o)
	return err
}

func TestOutboxTest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, st := outboxtest.Schema(t, "")

	// Inside the transaction its message is visible; outside, not until it commits.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, placeOrder(ctx, tx, st, order{ID: 42, SKU: "SKU-1"}))
	msg := outboxtest.RequireEnqueued(t, tx, st, "order.created", func(o order) bool { return o.ID == 42 })
	outboxtest.RequireNotEnqueued(t, pool, st, "order.created")
	outboxtest.RequireNotEnqueued(t, tx, st, "order.cancelled")
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, msg.MessageID, outboxtest.RequireEnqueued[order](t, pool, st, "order.created", nil).MessageID)

	// The same through a database/sql transaction (store.SQLTx), headers included.
	sqlDB := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = sqlDB.Close() })
	sqlTx, err := sqlDB.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = st.Enqueue(ctx, store.SQLTx(sqlTx), store.Message{Topic: "order.shipped", Payload: []byte(`{"order_id": 42}`),
		Headers: map[string]string{"tenant": "t-1"}})
	require.NoError(t, err)
	shipped := outboxtest.RequireEnqueued(t, store.SQLTx(sqlTx), st, "order.shipped", func(o order) bool { return o.ID == 42 })
	require.Equal(t, map[string]string{"tenant": "t-1"}, shipped.Headers)
	require.JSONEq(t, `{"order_id": 42}`, string(shipped.Payload))
	outboxtest.RequireNotEnqueued(t, pool, st, "order.shipped")
	require.NoError(t, sqlTx.Rollback())

	// The team's handler activity against OutboxDelivery, without a Temporal server.
	var got []delivery.Message
	policy := workflows.Policy{MaxAttempts: 3, Activity: &workflows.ActivityHandler{Activity: "ReserveStock", TaskQueue: "inventory"}}
	res, err := outboxtest.Deliver(t, st, msg.MessageID, policy, func(r outboxtest.Registry) {
		r.RegisterActivityWithOptions(func(_ context.Context, m delivery.Message) error {
			got = append(got, m)
			if m.Attempt == 1 {
				return temporal.NewApplicationError("stock service busy", "Busy")
			}
			return nil
		}, activity.RegisterOptions{Name: "ReserveStock"})
	})
	require.NoError(t, err)
	require.Equal(t, 2, res.Attempts)
	require.Len(t, got, 2)
	require.JSONEq(t, `{"order_id": 42, "sku": "SKU-1"}`, string(got[1].Payload))
	row, err := st.Get(ctx, msg.MessageID)
	require.NoError(t, err)
	require.Equal(t, store.StatusSent, row.Status)

	// A handler that refuses the message: dead-lettered, with the reason.
	refused, err := st.Enqueue(ctx, pool, store.Message{Topic: "order.created", Payload: []byte(`{"order_id": 43}`)})
	require.NoError(t, err)
	_, err = outboxtest.Deliver(t, st, refused, policy, func(r outboxtest.Registry) {
		r.RegisterActivityWithOptions(func(context.Context, delivery.Message) error {
			return temporal.NewNonRetryableApplicationError("SKU missing", "BadOrder", nil)
		}, activity.RegisterOptions{Name: "ReserveStock"})
	})
	var appErr *temporal.ApplicationError
	require.ErrorAs(t, err, &appErr)
	require.Equal(t, workflows.ErrTypeDeadLettered, appErr.Type())
	dls, err := st.DeadLetters(ctx, refused)
	require.NoError(t, err)
	require.Len(t, dls, 1)
	require.Equal(t, "permanent failure: SKU missing", dls[0].LastError)

	// A signal topic and a Nexus topic need a server: refused, the row left pending (it
	// was dead-lettered as if the topic could not be delivered).
	waiting, err := st.Enqueue(ctx, pool, store.Message{Topic: "order.created", Payload: []byte(`{"order_id": 44}`)})
	require.NoError(t, err)
	_, err = outboxtest.Deliver(t, st, waiting, workflows.Policy{Workflow: &workflows.WorkflowHandler{Workflow: "Fulfil", TaskQueue: "q", Signal: "order"}}, nil)
	require.ErrorContains(t, err, "cannot run a workflow topic with a signal (workflow Fulfil, signal order)")
	_, err = outboxtest.Deliver(t, st, waiting, workflows.Policy{Nexus: &workflows.NexusHandler{Endpoint: "e", Service: "s", Operation: "o"}}, nil)
	require.ErrorContains(t, err, "cannot run a Nexus topic")
	row, err = st.Get(ctx, waiting)
	require.NoError(t, err)
	require.Equal(t, store.StatusPending, row.Status)
}
