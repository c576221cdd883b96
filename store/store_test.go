package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
)

func msg(topic, payload string) store.Message {
	return store.Message{Topic: topic, Payload: json.RawMessage(payload)}
}

func count(t *testing.T, pool *pgxpool.Pool, st *store.Store, where string, args ...any) int {
	t.Helper()
	var n int
	q := fmt.Sprintf(`SELECT count(*) FROM %s.outbox_messages WHERE %s`, st.Schema(), where)
	require.NoError(t, pool.QueryRow(context.Background(), q, args...).Scan(&n))
	return n
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, st := testdb.Schema(t)

	t.Run("RerunIsNoop", func(t *testing.T) {
		applied, err := st.Migrate(ctx)
		require.NoError(t, err)
		require.Empty(t, applied)
	})

	t.Run("PlainSQLRowWithTopicAndPayloadOnly", func(t *testing.T) {
		_, err := pool.Exec(ctx, `INSERT INTO `+st.Schema()+`.outbox_messages (topic, payload) VALUES ('order.created', '{"order_id": 7}')`)
		require.NoError(t, err)
		var (
			id            uuid.UUID
			status        store.Status
			retryTimes    int
			maxRetryTimes *int
			createdAt     time.Time
		)
		require.NoError(t, pool.QueryRow(ctx, `SELECT message_id, status, retry_times, max_retry_times, created_at
			FROM `+st.Schema()+`.outbox_messages WHERE topic = 'order.created'`).Scan(&id, &status, &retryTimes, &maxRetryTimes, &createdAt))
		require.NotEqual(t, uuid.Nil, id)
		require.Equal(t, store.StatusPending, status)
		require.Equal(t, 0, retryTimes)
		require.Nil(t, maxRetryTimes)
		require.WithinDuration(t, time.Now(), createdAt, time.Minute)
	})

	t.Run("ConstraintsRejectBadPlainSQLRows", func(t *testing.T) {
		for _, tc := range []struct{ cols, vals, constraint string }{
			{"topic, payload, status", `'a', '{}', 'failed'`, "outbox_messages_status_check"},
			{"topic, payload, max_retry_times", `'a', '{}', 101`, "outbox_messages_max_retry_times_check"},
			{"topic, payload, max_retry_times", `'a', '{}', -1`, "outbox_messages_max_retry_times_check"},
			{"topic, payload", `'', '{}'`, "outbox_messages_topic_check"},
			{"topic, payload", `repeat('é', 201), '{}'`, "outbox_messages_topic_check"},
			{"topic, payload, ordering_key", `'a', '{}', ''`, "outbox_messages_ordering_key_check"},
			{"topic, payload, ordering_key", `'a', '{}', repeat('k', 201)`, "outbox_messages_ordering_key_check"},
			{"topic, payload, status", `'a', '{}', 'claimed'`, "outbox_messages_claim_check"},
			{"topic, payload, retry_times", `'a', '{}', -1`, "outbox_messages_retry_times_check"},
			{"topic, payload, redrive_count", `'a', '{}', -1`, "outbox_messages_redrive_count_check"},
		} {
			_, err := pool.Exec(ctx, `INSERT INTO `+st.Schema()+`.outbox_messages (`+tc.cols+`) VALUES (`+tc.vals+`)`)
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr, tc.vals)
			require.Equal(t, tc.constraint, pgErr.ConstraintName, tc.vals)
		}
	})

	t.Run("ConstraintsAcceptTheirBounds", func(t *testing.T) {
		// The bounds count characters, not bytes: 200 two-byte characters are accepted.
		for _, tc := range []struct{ cols, vals string }{
			{"topic, payload", `repeat('é', 200), '{}'`},
			{"topic, payload, ordering_key", `'a', '{}', repeat('é', 200)`},
			{"topic, payload, ordering_key", `'a', '{}', 'k'`},
			{"topic, payload, max_retry_times", `'a', '{}', 0`},
			{"topic, payload, max_retry_times", `'a', '{}', 100`},
			{"topic, payload, status, lease_until, claim_token", `'a', '{}', 'claimed', now(), gen_random_uuid()`},
		} {
			_, err := pool.Exec(ctx, `INSERT INTO `+st.Schema()+`.outbox_messages (`+tc.cols+`) VALUES (`+tc.vals+`)`)
			require.NoError(t, err, tc.vals)
		}
		for _, status := range []store.Status{store.StatusPending, store.StatusDispatched, store.StatusSent, store.StatusDead, store.StatusDiscarded} {
			_, err := pool.Exec(ctx, `INSERT INTO `+st.Schema()+`.outbox_messages (topic, payload, status) VALUES ('a', '{}', $1)`, status)
			require.NoError(t, err, status)
		}
	})
}

func TestEnqueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("InTransactionCommits", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `CREATE TABLE `+st.Schema()+`.orders (id int)`)
		require.NoError(t, err)
		retries := 2
		id, err := st.Enqueue(ctx, tx, store.Message{
			Topic: "order.created", Payload: json.RawMessage(`{"id": 1, "note": "ünïcödé \" \\"}`),
			Headers: map[string]string{"traceparent": "00-abc"}, MaxRetryTimes: &retries,
		})
		require.NoError(t, err)
		require.Zero(t, count(t, pool, st, "message_id = $1", id), "invisible before commit")
		require.NoError(t, tx.Commit(ctx))

		row, err := st.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, "order.created", row.Topic)
		require.JSONEq(t, `{"id": 1, "note": "ünïcödé \" \\"}`, string(row.Payload))
		require.Equal(t, map[string]string{"traceparent": "00-abc"}, row.Headers)
		require.Equal(t, 2, *row.MaxRetryTimes)
		require.Equal(t, store.StatusPending, row.Status)
		require.Equal(t, byte(7), id[6]>>4, "message IDs are UUIDv7")
	})

	t.Run("RollbackLeavesNoRowAndNoNotification", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		require.NoError(t, st.SetNotify(ctx, true)) // relay.wakeup: notify
		listener, err := pool.Acquire(ctx)
		require.NoError(t, err)
		defer listener.Release()
		_, err = listener.Exec(ctx, `LISTEN `+pgx.Identifier{st.Channel()}.Sanitize())
		require.NoError(t, err)

		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		id, err := st.Enqueue(ctx, tx, msg("order.created", `{}`))
		require.NoError(t, err)
		require.NoError(t, tx.Rollback(ctx))
		_, err = pool.Exec(ctx, `SELECT pg_notify($1, 'sentinel')`, st.Channel())
		require.NoError(t, err)

		waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		n, err := listener.Conn().WaitForNotification(waitCtx)
		require.NoError(t, err)
		require.Equal(t, "sentinel", n.Payload, "the rolled-back insert must not notify")
		require.Zero(t, count(t, pool, st, "message_id = $1", id))
	})

	t.Run("CommitNotifiesOncePerStatement", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		require.NoError(t, st.SetNotify(ctx, true)) // relay.wakeup: notify
		listener, err := pool.Acquire(ctx)
		require.NoError(t, err)
		defer listener.Release()
		_, err = listener.Exec(ctx, `LISTEN `+pgx.Identifier{st.Channel()}.Sanitize())
		require.NoError(t, err)

		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		for range 3 {
			_, err = st.Enqueue(ctx, tx, msg("order.created", `{}`))
			require.NoError(t, err)
		}
		require.NoError(t, tx.Commit(ctx))
		_, err = pool.Exec(ctx, `SELECT pg_notify($1, 'sentinel')`, st.Channel())
		require.NoError(t, err)

		waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		n, err := listener.Conn().WaitForNotification(waitCtx)
		require.NoError(t, err)
		require.Equal(t, "", n.Payload, "the insert notifies first")
		n, err = listener.Conn().WaitForNotification(waitCtx)
		require.NoError(t, err)
		require.Equal(t, "sentinel", n.Payload, "identical notifications of one transaction collapse")
	})

	t.Run("NoNotificationByDefault", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		on, err := st.NotifyEnabled(ctx)
		require.NoError(t, err)
		require.False(t, on, "the NOTIFY trigger is off unless relay.wakeup is notify")
		listener, err := pool.Acquire(ctx)
		require.NoError(t, err)
		defer listener.Release()
		_, err = listener.Exec(ctx, `LISTEN `+pgx.Identifier{st.Channel()}.Sanitize())
		require.NoError(t, err)
		_, err = st.Enqueue(ctx, pool, msg("order.created", `{}`))
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `SELECT pg_notify($1, 'sentinel')`, st.Channel())
		require.NoError(t, err)
		waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		n, err := listener.Conn().WaitForNotification(waitCtx)
		require.NoError(t, err)
		require.Equal(t, "sentinel", n.Payload, "an enqueue pays no NOTIFY")
		require.NoError(t, st.SetNotify(ctx, true))
		on, err = st.NotifyEnabled(ctx)
		require.NoError(t, err)
		require.True(t, on)
	})

	t.Run("ValidationErrorsNameFieldAndValueAndWriteNothing", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		big := `{"s": "` + strings.Repeat("x", store.DefaultMaxPayloadBytes) + `"}`
		neg, over := -1, 101
		for _, tc := range []struct {
			name  string
			msg   store.Message
			field string
			want  string
		}{
			{"EmptyTopic", msg("", `{}`), "topic", `got ""`},
			{"TopicWithSpace", msg("Order Created", `{}`), "topic", `got "Order Created"`},
			{"TopicTooLong", msg(strings.Repeat("a", 201), `{}`), "topic", "must match"},
			{"EmptyPayload", msg("a", ``), "payload", "got nothing"},
			{"InvalidJSON", msg("a", `{"a":`), "payload", `must be valid JSON, got "{\"a\":"`},
			{"TooLarge", msg("a", big), "payload", fmt.Sprintf("must be at most %d bytes, got %d bytes", store.DefaultMaxPayloadBytes, len(big))},
			{"NUL", msg("a", `{"a": "x\u0000y"}`), "payload", `\u0000`},
			{"NULInKey", msg("a", `{"\u0000": 1}`), "payload", `\u0000`},
			{"NegativeRetries", store.Message{Topic: "a", Payload: json.RawMessage(`{}`), MaxRetryTimes: &neg}, "max_retry_times", "between 0 and 100, got -1"},
			{"TooManyRetries", store.Message{Topic: "a", Payload: json.RawMessage(`{}`), MaxRetryTimes: &over}, "max_retry_times", "got 101"},
			{"EmptyHeaderKey", store.Message{Topic: "a", Payload: json.RawMessage(`{}`), Headers: map[string]string{"": "x"}}, "headers", "non-empty UTF-8 keys"},
			{"HeadersTooLarge", store.Message{Topic: "a", Payload: json.RawMessage(`{}`), Headers: map[string]string{"traceparent": "00-x", "blob": strings.Repeat("x", 32<<10)}},
				"headers", "must be at most 32768 bytes of keys and values together, got 32787 bytes in 2 headers"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, err := st.Enqueue(ctx, pool, tc.msg)
				var verr *store.ValidationError
				require.ErrorAs(t, err, &verr)
				require.Equal(t, tc.field, verr.Field)
				require.Contains(t, err.Error(), tc.want)
				require.Contains(t, err.Error(), tc.field)
			})
		}
		require.Zero(t, count(t, pool, st, "true"))
	})

	t.Run("EscapedBackslashBeforeU0000IsText", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		id, err := st.Enqueue(ctx, pool, msg("a", `{"path": "C:\\u0000dir"}`))
		require.NoError(t, err)
		row, err := st.Get(ctx, id)
		require.NoError(t, err)
		require.JSONEq(t, `{"path": "C:\\u0000dir"}`, string(row.Payload))
	})

	t.Run("PackageFunctionUsesPublicSchema", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		// Inside a transaction that is rolled back, so public is left as it was.
		_, err = tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS public.outbox_messages (LIKE `+st.Schema()+`.outbox_messages INCLUDING ALL)`)
		require.NoError(t, err)
		id, err := store.Enqueue(ctx, tx, msg("a", `{"k": "v"}`))
		require.NoError(t, err)
		var topic string
		require.NoError(t, tx.QueryRow(ctx, `SELECT topic FROM public.outbox_messages WHERE message_id = $1`, id).Scan(&topic))
		require.Equal(t, "a", topic)
	})
}

func TestClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	enqueue := func(t *testing.T, pool *pgxpool.Pool, st *store.Store, n int) []uuid.UUID {
		t.Helper()
		ids := make([]uuid.UUID, n)
		for i := range ids {
			id, err := st.Enqueue(ctx, pool, msg("t", fmt.Sprintf(`{"i": %d}`, i)))
			require.NoError(t, err)
			ids[i] = id
		}
		return ids
	}

	t.Run("ExclusiveAcrossConcurrentClaimers", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		const total = 500
		enqueue(t, pool, st, total)
		var (
			mu   sync.Mutex
			seen = map[int64]int{}
			wg   sync.WaitGroup
		)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					batch, err := st.Claim(ctx, 7, time.Minute)
					if err != nil {
						t.Error(err)
						return
					}
					if len(batch) == 0 {
						return
					}
					mu.Lock()
					for _, c := range batch {
						seen[c.ID]++
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		require.Len(t, seen, total)
		for id, n := range seen {
			require.Equal(t, 1, n, "row %d claimed %d times", id, n)
		}
		require.Equal(t, total, count(t, pool, st, "status = 'claimed' AND lease_until > now()"))
	})

	t.Run("ExpiredLeaseIsReclaimable", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		enqueue(t, pool, st, 1)
		first, err := st.Claim(ctx, 10, time.Hour)
		require.NoError(t, err)
		require.Len(t, first, 1)
		again, err := st.Claim(ctx, 10, time.Hour)
		require.NoError(t, err)
		require.Empty(t, again, "a live lease is not claimable")

		_, err = pool.Exec(ctx, `UPDATE `+st.Schema()+`.outbox_messages SET lease_until = now() - interval '1 second'`)
		require.NoError(t, err)
		second, err := st.Claim(ctx, 10, time.Hour)
		require.NoError(t, err)
		require.Len(t, second, 1)
		require.Equal(t, first[0].ID, second[0].ID)
		require.NotEqual(t, first[0].ClaimToken, second[0].ClaimToken)

		ok, err := st.MarkDispatched(ctx, first[0].ID, first[0].ClaimToken)
		require.NoError(t, err)
		require.False(t, ok, "the first claimer lost its lease")
		ok, err = st.MarkDispatched(ctx, second[0].ID, second[0].ClaimToken)
		require.NoError(t, err)
		require.True(t, ok)
	})

	t.Run("MarkDispatchedAllOnlyUnderItsClaim", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		enqueue(t, pool, st, 4)
		claimed, err := st.Claim(ctx, 10, time.Hour)
		require.NoError(t, err)
		require.Len(t, claimed, 4)
		// One row finished before the batch is recorded, one was reclaimed by another
		// relay after its lease: neither moves.
		ok, err := st.MarkSent(ctx, claimed[0].MessageID)
		require.NoError(t, err)
		require.True(t, ok)
		_, err = pool.Exec(ctx, `UPDATE `+st.Schema()+`.outbox_messages SET lease_until = now() - interval '1 second' WHERE id = $1`, claimed[1].ID)
		require.NoError(t, err)
		again, err := st.Claim(ctx, 10, time.Hour)
		require.NoError(t, err)
		require.Len(t, again, 1)

		n, err := st.MarkDispatchedAll(ctx, claimed)
		require.NoError(t, err)
		require.Equal(t, 2, n)
		want := map[uuid.UUID]store.Status{
			claimed[0].MessageID: store.StatusSent, claimed[1].MessageID: store.StatusClaimed,
			claimed[2].MessageID: store.StatusDispatched, claimed[3].MessageID: store.StatusDispatched,
		}
		for _, c := range claimed {
			row, err := st.Get(ctx, c.MessageID)
			require.NoError(t, err)
			require.Equal(t, want[c.MessageID], row.Status, "message %s", c.MessageID)
		}
		n, err = st.MarkDispatchedAll(ctx, nil)
		require.NoError(t, err)
		require.Zero(t, n)
	})

	t.Run("NotBeforeNextRetryAt", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		ids := enqueue(t, pool, st, 2)
		_, err := pool.Exec(ctx, `UPDATE `+st.Schema()+`.outbox_messages SET next_retry_at = now() + interval '1 hour' WHERE message_id = $1`, ids[0])
		require.NoError(t, err)
		got, err := st.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Len(t, got, 1)
		require.Equal(t, ids[1], got[0].MessageID)
	})

	t.Run("RetryClaimAfter", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		enqueue(t, pool, st, 1)
		claimed, err := st.Claim(ctx, 1, time.Minute)
		require.NoError(t, err)
		require.Len(t, claimed, 1)
		c := claimed[0]
		ok, err := st.RetryClaimAfter(ctx, c.ID, uuid.New(), 0)
		require.NoError(t, err)
		require.False(t, ok, "only the holder of the claim")

		ok, err = st.RetryClaimAfter(ctx, c.ID, c.ClaimToken, 300*time.Millisecond)
		require.NoError(t, err)
		require.True(t, ok)
		again, err := st.Claim(ctx, 1, time.Minute)
		require.NoError(t, err)
		require.Empty(t, again, "still claimed until the short lease ends")
		require.Eventually(t, func() bool {
			again, err = st.Claim(ctx, 1, time.Minute)
			require.NoError(t, err)
			return len(again) == 1
		}, 10*time.Second, 50*time.Millisecond, "claimed again soon, not after the minute")
		require.Equal(t, c.ID, again[0].ID)
		require.NotEqual(t, c.ClaimToken, again[0].ClaimToken)
		ok, err = st.RetryClaimAfter(ctx, c.ID, c.ClaimToken, 0)
		require.NoError(t, err)
		require.False(t, ok, "the old claim is gone")
	})

	t.Run("LateDispatchedNeverOverwritesSent", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		ids := enqueue(t, pool, st, 1)
		claimed, err := st.Claim(ctx, 1, time.Minute)
		require.NoError(t, err)
		require.Len(t, claimed, 1)
		ok, err := st.MarkSent(ctx, ids[0])
		require.NoError(t, err)
		require.True(t, ok)
		ok, err = st.MarkDispatched(ctx, claimed[0].ID, claimed[0].ClaimToken)
		require.NoError(t, err)
		require.False(t, ok)
		ok, err = st.RecordFailure(ctx, ids[0], 3, "late")
		require.NoError(t, err)
		require.False(t, ok)
		ok, err = st.DeadLetter(ctx, store.DeadLetter{MessageID: ids[0], Topic: "t", WorkflowID: "w", RunID: "r", Attempts: 1, LastError: "late"})
		require.NoError(t, err)
		require.False(t, ok)
		row, err := st.Get(ctx, ids[0])
		require.NoError(t, err)
		require.Equal(t, store.StatusSent, row.Status)
		require.NotNil(t, row.SentAt)
		require.Nil(t, row.LastError)
		dls, err := st.DeadLetters(ctx, ids[0])
		require.NoError(t, err)
		require.Empty(t, dls)
		again, err := st.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Empty(t, again)
	})

	t.Run("ExplainUsesClaimIndex", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		// Many sent rows and a few pending ones, as in a table that has been running.
		_, err := pool.Exec(ctx, `INSERT INTO `+st.Schema()+`.outbox_messages (topic, payload, status, sent_at)
			SELECT 't', '{}', 'sent', now() FROM generate_series(1, 20000)`)
		require.NoError(t, err)
		enqueue(t, pool, st, 5)
		_, err = pool.Exec(ctx, `ANALYZE `+st.Schema()+`.outbox_messages`)
		require.NoError(t, err)

		explain := func(sql string, args ...any) string {
			t.Helper()
			rows, err := pool.Query(ctx, `EXPLAIN `+sql, args...)
			require.NoError(t, err)
			lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			plan := strings.Join(lines, "\n")
			t.Log(plan)
			require.NotContains(t, plan, "Seq Scan on outbox_messages", plan)
			return plan
		}

		// With a limit on messages in flight, which reads the rows in flight by topic.
		plan := explain(st.ClaimSQL(), uuid.New(), 30.0, 100, []string{}, []string{}, false, []string{}, false, 100, []string{"slow"}, []int32{500})
		require.Contains(t, plan, "outbox_messages_claim_idx", plan)
		require.Contains(t, plan, "outbox_messages_in_flight_idx", plan)
		// The paused topics are read once per claim, not once per row.
		require.Regexp(t, `InitPlan \d+ \(returns \$\d+\)\n\s+->  Seq Scan on outbox_topic_pauses`, plan)

		// The unparking of rows parked for the limit walks the parked rows' topics, and the
		// probe before it (which finds before most claims that nothing is parked) reads the
		// same index.
		require.Contains(t, explain(st.UnparkLimitedSQL(), 100, []string{"slow"}, []int32{500}), "outbox_messages_parked_topic_idx")
		require.Contains(t, explain(st.AnyParkedSQL()), "outbox_messages_parked_topic_idx")

		// Parking and unparking keyed rows look for an earlier open message of each key
		// through the ordering index, never through the whole table (which holds the sent
		// rows retention keeps), while they hold the keys' park lock.
		rules := []any{[]string{}, []string{}, false, []string{}, false}
		for _, plan := range []string{
			explain(st.ParkKeysSQL(), append([]any{[]string{"k1", "k2"}}, rules...)...),
			explain(st.RecheckParkedSQL(), append([]any{[]int64{1, 2}}, rules...)...),
			explain(st.UnparkSQL(), rules...),
		} {
			require.Contains(t, plan, "outbox_messages_ordering_idx", plan)
		}
	})
}

func TestDeadLetter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, st := testdb.Schema(t)
	id, err := st.Enqueue(ctx, pool, msg("order.created", `{"a": 1}`))
	require.NoError(t, err)

	d := store.DeadLetter{MessageID: id, Topic: "order.created", WorkflowID: "outbox-" + id.String(), RunID: "run-1", Attempts: 4, LastError: "HTTP 500"}
	ok, err := st.DeadLetter(ctx, d)
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = st.DeadLetter(ctx, d) // a retried activity
	require.NoError(t, err)
	require.False(t, ok)

	row, err := st.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, store.StatusDead, row.Status)
	require.Equal(t, "HTTP 500", *row.LastError)
	dls, err := st.DeadLetters(ctx, id)
	require.NoError(t, err)
	require.Len(t, dls, 1)
	require.Equal(t, 4, dls[0].Attempts)
	require.Equal(t, "run-1", dls[0].RunID)
	require.JSONEq(t, `{"a": 1}`, string(dls[0].Payload))

	_, err = st.Get(ctx, uuid.New())
	require.True(t, errors.Is(err, store.ErrNotFound))
}
