package mysqlstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-go/outbox/store/mysqlstore"
	"github.com/outbox-go/outbox/store/storedriver"
)

// TestRelaysDeliverEachKeyInOrder runs three relays that claim, hand over and record sent
// concurrently, while two writers enqueue keyed messages of a few keys among unkeyed ones,
// and no sweep runs: the releases and the claims' rechecks alone must hand every key's
// messages over one at a time, in order, and leave nothing parked.
func TestRelaysDeliverEachKeyInOrder(t *testing.T) {
	ctx := context.Background()
	st, db := newStore(t)
	retried := mysqlstore.DeadlockRetried()
	defer func() { t.Logf("transactions run again after a deadlock: %d", mysqlstore.DeadlockRetried()-retried) }()
	const keys, perKey = 4, 30
	batch := func(from, to int) []storedriver.Message {
		var msgs []storedriver.Message
		for i := from; i < to; i++ {
			for k := range keys {
				msgs = append(msgs, keyed("order.event", fmt.Sprintf("order-%d", k), fmt.Sprintf(`{"i":%d}`, i)))
			}
			msgs = append(msgs, msg("other", `{}`))
		}
		return msgs
	}
	total := perKey * (keys + 1)
	_, err := st.EnqueueBatch(ctx, db, batch(0, perKey/3))
	require.NoError(t, err)

	var (
		mu        sync.Mutex
		lastSeq   = map[string]int64{}
		delivered int
		wg        sync.WaitGroup
		errs      = make([]error, 5)
	)
	// Two writers enqueue the rest, one message per transaction, in the batch's order.
	rest := batch(perKey/3, perKey)
	for w := range 2 {
		wg.Go(func() {
			for i := w; i < len(rest); i += 2 {
				tx, err := db.BeginTx(ctx, nil)
				if err == nil {
					_, err = st.Enqueue(ctx, tx, rest[i])
					if err == nil {
						err = tx.Commit()
					} else {
						_ = tx.Rollback()
					}
				}
				if err != nil {
					errs[3+w] = err
					return
				}
			}
		})
	}
	deadline := time.Now().Add(60 * time.Second)
	for r := range 3 {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				mu.Lock()
				done := delivered == total
				mu.Unlock()
				if done {
					return
				}
				res, err := st.ClaimBatch(ctx, 5, time.Minute, storedriver.OrderingRules{})
				if err != nil {
					errs[r] = err
					return
				}
				ids := make([]uuid.UUID, len(res.Claimed))
				for i, c := range res.Claimed {
					ids[i] = c.MessageID
				}
				rows, err := st.GetAll(ctx, ids)
				if err != nil {
					errs[r] = err
					return
				}
				mu.Lock()
				for _, row := range rows {
					if row.OrderingKey != nil {
						key := *row.OrderingKey
						if *row.OrderingSeq <= lastSeq[key] {
							errs[r] = fmt.Errorf("key %s: message %d handed over after %d", key, *row.OrderingSeq, lastSeq[key])
						}
						lastSeq[key] = *row.OrderingSeq
					}
				}
				mu.Unlock()
				if _, err := st.MarkDispatchedAll(ctx, res.Claimed); err != nil {
					errs[r] = err
					return
				}
				for _, c := range res.Claimed {
					if _, err := st.RecordSent(ctx, c.MessageID); err != nil {
						errs[r] = err
						return
					}
					mu.Lock()
					delivered++
					mu.Unlock()
				}
				if len(res.Claimed) == 0 {
					time.Sleep(2 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, total, delivered, "every message delivered without the sweep")
	for k := range keys {
		assert.Equal(t, int64(perKey), lastSeq[fmt.Sprintf("order-%d", k)])
	}
	var parked int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT COUNT(*) FROM outbox_messages WHERE held_back`).Scan(&parked))
	assert.Zero(t, parked)
}

func TestEnqueueWritesTraceContext(t *testing.T) {
	ctx := context.Background()
	st, db := newStore(t)
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
		SpanID:     trace.SpanID{1, 2, 3, 4, 5, 6, 7, 8},
		TraceFlags: trace.FlagsSampled,
	})
	id, err := st.Enqueue(trace.ContextWithSpanContext(ctx, sc), db, storedriver.Message{Topic: "t", Payload: []byte(`{}`), Headers: map[string]string{"tenant": "7"}})
	require.NoError(t, err)
	row, err := st.Get(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-01", row.Headers["traceparent"])
	assert.Equal(t, "7", row.Headers["tenant"])

	id, err = st.Enqueue(ctx, db, msg("t", `{}`))
	require.NoError(t, err)
	row, err = st.Get(ctx, id)
	require.NoError(t, err)
	assert.Empty(t, row.Headers)
}
