package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
)

// BenchmarkClaim measures one claim of 100 rows beside 1,000 and 100,000 sent rows: the
// partial index keeps it flat.
func BenchmarkClaim(b *testing.B) {
	ctx := context.Background()
	for _, sent := range []int{1_000, 100_000} {
		b.Run(fmt.Sprintf("Sent%d", sent), func(b *testing.B) {
			pool, st := testdb.Schema(b)
			seed(b, pool, st, sent)
			b.ResetTimer()
			for range b.N {
				claimed, err := st.Claim(ctx, 100, time.Minute)
				require.NoError(b, err)
				require.Len(b, claimed, 100)
				b.StopTimer()
				reset(b, pool, st)
				b.StartTimer()
			}
		})
	}
}

// BenchmarkClaimBesideWaitingRows measures the claim of 100 due rows beside 100,000 rows
// that are not due: none (the baseline), held back behind a dead message of their ordering
// key, delayed (next_retry_at an hour ahead), or waiting for room under their topic's limit
// of messages in flight (the claim then runs with that limit, and unparks before it claims,
// as a relay does; NoneWithALimit is the same limit with nothing waiting). The claim must
// cost about the same in all of them.
func BenchmarkClaimBesideWaitingRows(b *testing.B) {
	ctx := context.Background()
	const waiting = 100_000
	for _, tc := range []struct {
		name  string
		rules store.OrderingRules
		seed  func(b *testing.B, pool *pgxpool.Pool, st *store.Store)
	}{
		{"None", store.OrderingRules{}, func(*testing.B, *pgxpool.Pool, *store.Store) {}},
		{"HeldBack", store.OrderingRules{}, func(b *testing.B, pool *pgxpool.Pool, st *store.Store) {
			// A dead message of key k, then 100,000 pending messages of k behind it, all
			// committed before the due rows (lower ids).
			res, err := st.EnqueueMessage(ctx, pool, store.Message{Topic: "order.created", OrderingKey: "k", Payload: json.RawMessage(`{}`)})
			require.NoError(b, err)
			_, err = pool.Exec(ctx, `UPDATE `+st.Schema()+`.outbox_messages SET status = 'dead' WHERE message_id = $1`, res.MessageID)
			require.NoError(b, err)
			_, err = pool.Exec(ctx, `INSERT INTO `+st.Schema()+`.outbox_messages (topic, payload, ordering_key)
				SELECT 'order.created', '{}', 'k' FROM generate_series(1, $1)`, waiting)
			require.NoError(b, err)
		}},
		{"Delayed", store.OrderingRules{}, func(b *testing.B, pool *pgxpool.Pool, st *store.Store) {
			_, err := pool.Exec(ctx, `INSERT INTO `+st.Schema()+`.outbox_messages (topic, payload, next_retry_at)
				SELECT 'order.created', '{}', now() + interval '1 hour' FROM generate_series(1, $1)`, waiting)
			require.NoError(b, err)
		}},
		// The limit on, and nothing waiting for room: what unparking before each claim costs.
		{"NoneWithALimit", store.OrderingRules{TopicMaxInFlight: map[string]int{"bulk": 20}}, func(*testing.B, *pgxpool.Pool, *store.Store) {}},
		{"WaitingForRoom", store.OrderingRules{TopicMaxInFlight: map[string]int{"bulk": 20}}, func(b *testing.B, pool *pgxpool.Pool, st *store.Store) {
			// Topic bulk has its 20 messages in flight, and 100,000 more waiting.
			_, err := pool.Exec(ctx, `INSERT INTO `+st.Schema()+`.outbox_messages (topic, payload, status, dispatched_at)
				SELECT 'bulk', '{}', 'dispatched', now() FROM generate_series(1, 20)`)
			require.NoError(b, err)
			_, err = pool.Exec(ctx, `INSERT INTO `+st.Schema()+`.outbox_messages (topic, payload)
				SELECT 'bulk', '{}' FROM generate_series(1, $1)`, waiting)
			require.NoError(b, err)
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			pool, st := testdb.Schema(b)
			tc.seed(b, pool, st)
			seed(b, pool, st, 0)
			// The first claims park the waiting rows (once per row, as the relay does while
			// it drains a backlog); the benchmark measures the claims after that.
			began := time.Now()
			for {
				res, err := st.ClaimBatch(ctx, 100, time.Minute, tc.rules)
				require.NoError(b, err)
				reset(b, pool, st)
				if res.Parked == 0 {
					break
				}
			}
			if parking := time.Since(began); parking > time.Second {
				b.Logf("parking the waiting rows took %s", parking)
			}
			// Autovacuum clears the index entries of the rows' old versions in a running
			// system (the table vacuums at 2 %% changed rows); here it runs at once.
			_, err := pool.Exec(ctx, `VACUUM ANALYZE `+st.Schema()+`.outbox_messages`)
			require.NoError(b, err)
			b.ResetTimer()
			for range b.N {
				claimed, err := st.ClaimOrdered(ctx, 100, time.Minute, tc.rules)
				require.NoError(b, err)
				require.Len(b, claimed, 100)
				b.StopTimer()
				reset(b, pool, st)
				b.StartTimer()
			}
		})
	}
}

// reset puts the claimed rows back to pending.
func reset(b *testing.B, pool *pgxpool.Pool, st *store.Store) {
	_, err := pool.Exec(context.Background(), `UPDATE `+st.Schema()+`.outbox_messages SET status = 'pending', claim_token = NULL, lease_until = NULL WHERE status = 'claimed'`)
	require.NoError(b, err)
}

func seed(b *testing.B, pool *pgxpool.Pool, st *store.Store, sent int) {
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO `+st.Schema()+`.outbox_messages (topic, payload, status, sent_at)
		SELECT 'order.created', '{"order_id": 1}', 'sent', now() FROM generate_series(1, $1)`, sent)
	require.NoError(b, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+st.Schema()+`.outbox_messages (topic, payload)
		SELECT 'order.created', '{"order_id": 1}' FROM generate_series(1, 100)`)
	require.NoError(b, err)
	_, err = pool.Exec(ctx, `VACUUM ANALYZE `+st.Schema()+`.outbox_messages`)
	require.NoError(b, err)
}
