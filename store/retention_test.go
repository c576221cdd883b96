package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
)

const (
	sentAfter      = 7 * 24 * time.Hour
	discardedAfter = 30 * 24 * time.Hour
)

func purgeOptions(limit int, archive bool) store.PurgeOptions {
	return store.PurgeOptions{SentAfter: sentAfter, DiscardedAfter: discardedAfter, Limit: limit, Archive: archive}
}

// rows counts the rows of one of the schema's tables that match where.
func rows(t *testing.T, pool *pgxpool.Pool, st *store.Store, table, where string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(),
		fmt.Sprintf(`SELECT count(*) FROM %s.%s WHERE %s`, st.Schema(), table, where), args...).Scan(&n))
	return n
}

func exec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	_, err := pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err)
}

// insertSent inserts n sent messages whose sent_at is age ago (and a second older per row).
func insertSent(t *testing.T, pool *pgxpool.Pool, st *store.Store, n int, age time.Duration) {
	t.Helper()
	exec(t, pool, `INSERT INTO `+st.Schema()+`.outbox_messages (topic, payload, headers, status, retry_times, sent_at, dispatched_at)
		SELECT 'order.created', jsonb_build_object('i', g), '{"traceparent": "00-1"}', 'sent', 1,
		       now() - make_interval(secs => $2) - g * interval '1 second', now() - interval '400 days'
		FROM generate_series(1, $1) g`, n, age.Seconds())
}

// discarded enqueues a message, dead-letters it in each of runs (all but the last are
// redriven) and discards it, discardedAgo in the past. It returns the message ID.
func discarded(t *testing.T, pool *pgxpool.Pool, st *store.Store, discardedAgo time.Duration, runs int) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	id, err := st.Enqueue(ctx, pool, msg("order.created", `{"poison": true}`))
	require.NoError(t, err)
	for run := range runs {
		exec(t, pool, `UPDATE `+st.Schema()+`.outbox_messages SET status = 'dispatched' WHERE message_id = $1`, id)
		ok, err := st.DeadLetter(ctx, store.DeadLetter{MessageID: id, Topic: "order.created", WorkflowID: "outbox-" + id.String(),
			RunID: fmt.Sprintf("run-%d", run), Attempts: 4, LastError: "HTTP 422"})
		require.NoError(t, err)
		require.True(t, ok)
		if run < runs-1 {
			exec(t, pool, `UPDATE `+st.Schema()+`.outbox_dead_letters SET redriven_at = now() - make_interval(secs => $2), redriven_by = 'ops'
				WHERE message_id = $1 AND redriven_at IS NULL`, id, discardedAgo.Seconds()+60)
		}
	}
	exec(t, pool, `UPDATE `+st.Schema()+`.outbox_messages SET status = 'discarded', updated_at = now() - make_interval(secs => $2)
		WHERE message_id = $1`, id, discardedAgo.Seconds())
	exec(t, pool, `UPDATE `+st.Schema()+`.outbox_dead_letters SET discarded_at = now() - make_interval(secs => $2), discarded_by = 'ops'
		WHERE message_id = $1 AND redriven_at IS NULL`, id, discardedAgo.Seconds())
	return id
}

// orphanDeadLetter inserts a dead letter whose message row does not exist, discarded
// discardedAgo in the past (never discarded when discardedAgo is zero).
func orphanDeadLetter(t *testing.T, pool *pgxpool.Pool, st *store.Store, discardedAgo time.Duration) uuid.UUID {
	t.Helper()
	id := uuid.New()
	var at any
	if discardedAgo > 0 {
		at = time.Now().Add(-discardedAgo)
	}
	exec(t, pool, `INSERT INTO `+st.Schema()+`.outbox_dead_letters (message_id, workflow_id, run_id, topic, payload, attempts, last_error, discarded_at)
		VALUES ($1, $2, 'run-0', 'order.created', '{}', 1, 'HTTP 422', $3)`, id, "outbox-"+id.String(), at)
	return id
}

// untouchable inserts one old row in each status retention must never remove, with every
// timestamp far in the past.
func untouchable(t *testing.T, pool *pgxpool.Pool, st *store.Store) {
	t.Helper()
	for _, status := range []store.Status{store.StatusPending, store.StatusClaimed, store.StatusDispatched, store.StatusDead} {
		exec(t, pool, `INSERT INTO `+st.Schema()+`.outbox_messages (topic, payload, status, lease_until, claim_token, sent_at, created_at, updated_at)
			VALUES ('order.created', '{}', $1, now() - interval '400 days', gen_random_uuid(),
			        now() - interval '400 days', now() - interval '400 days', now() - interval '400 days')`, status)
	}
}

func TestPurge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ManyBatchesRemoveOnlyOldSentRows", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		insertSent(t, pool, st, 2500, sentAfter+time.Hour)
		insertSent(t, pool, st, 10, sentAfter-time.Hour) // recent: kept
		untouchable(t, pool, st)

		first, err := st.PurgeBatch(ctx, purgeOptions(1000, false))
		require.NoError(t, err)
		require.Equal(t, store.PurgeResult{SentMessages: 1000, Batches: 1, More: true}, first)
		require.Equal(t, 1500, rows(t, pool, st, "outbox_messages", "status = 'sent' AND sent_at < now() - interval '7 days'"))
		require.Zero(t, rows(t, pool, st, "outbox_messages", "(payload->>'i')::int > 1500"), "oldest first")

		total, err := st.Purge(ctx, purgeOptions(1000, false))
		require.NoError(t, err)
		require.Equal(t, store.PurgeResult{SentMessages: 1500, Batches: 2}, total)

		require.Equal(t, 10, rows(t, pool, st, "outbox_messages", "status = 'sent'"))
		for _, status := range []string{"pending", "claimed", "dispatched", "dead"} {
			require.Equal(t, 1, rows(t, pool, st, "outbox_messages", "status = $1", status), status)
		}
		require.Zero(t, rows(t, pool, st, "outbox_messages_archive", "true"))

		again, err := st.Purge(ctx, purgeOptions(1000, false))
		require.NoError(t, err)
		require.Equal(t, store.PurgeResult{Batches: 1}, again, "nothing left to remove")
	})

	t.Run("ThreeBatchesForTwoAndAHalfThousand", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		insertSent(t, pool, st, 2500, sentAfter+time.Minute)
		total, err := st.Purge(ctx, purgeOptions(1000, false))
		require.NoError(t, err)
		require.Equal(t, store.PurgeResult{SentMessages: 2500, Batches: 3}, total)
		require.Zero(t, rows(t, pool, st, "outbox_messages", "true"))
	})

	t.Run("DiscardedMessagesAndTheirDeadLettersAfterDiscardedAfter", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		old := discarded(t, pool, st, discardedAfter+time.Hour, 2) // two dead letters, one redriven
		recent := discarded(t, pool, st, discardedAfter-time.Hour, 1)
		oldOrphan := orphanDeadLetter(t, pool, st, discardedAfter+time.Hour)
		recentOrphan := orphanDeadLetter(t, pool, st, discardedAfter-time.Hour)
		openOrphan := orphanDeadLetter(t, pool, st, 0)
		untouchable(t, pool, st)
		// A dead message whose earlier dead letter was discarded long ago: it is live, so
		// neither it nor its dead letters go.
		dead := discarded(t, pool, st, discardedAfter+time.Hour, 1)
		exec(t, pool, `UPDATE `+st.Schema()+`.outbox_messages SET status = 'dead' WHERE message_id = $1`, dead)

		total, err := st.Purge(ctx, purgeOptions(1000, false))
		require.NoError(t, err)
		require.Equal(t, store.PurgeResult{DiscardedMessages: 1, DeadLetters: 3, Batches: 1}, total)

		require.Zero(t, rows(t, pool, st, "outbox_messages", "message_id = $1", old))
		require.Zero(t, rows(t, pool, st, "outbox_dead_letters", "message_id = $1", old))
		require.Zero(t, rows(t, pool, st, "outbox_dead_letters", "message_id = $1", oldOrphan))
		require.Equal(t, 1, rows(t, pool, st, "outbox_messages", "message_id = $1", recent))
		require.Equal(t, 1, rows(t, pool, st, "outbox_dead_letters", "message_id = $1", recent))
		require.Equal(t, 1, rows(t, pool, st, "outbox_dead_letters", "message_id = $1", recentOrphan))
		require.Equal(t, 1, rows(t, pool, st, "outbox_dead_letters", "message_id = $1", openOrphan))
		require.Equal(t, 1, rows(t, pool, st, "outbox_messages", "message_id = $1", dead))
		require.Equal(t, 1, rows(t, pool, st, "outbox_dead_letters", "message_id = $1", dead))
		require.Equal(t, 2, rows(t, pool, st, "outbox_messages", "status = 'dead'"))
		require.Equal(t, 6, rows(t, pool, st, "outbox_messages", "true"))
	})

	t.Run("LimitSharedBySentDiscardedAndOrphans", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		insertSent(t, pool, st, 1, sentAfter+time.Hour)
		discarded(t, pool, st, discardedAfter+time.Hour, 1)
		discarded(t, pool, st, discardedAfter+2*time.Hour, 1)
		orphanDeadLetter(t, pool, st, discardedAfter+time.Hour)

		first, err := st.PurgeBatch(ctx, purgeOptions(2, false))
		require.NoError(t, err)
		require.Equal(t, store.PurgeResult{SentMessages: 1, DiscardedMessages: 1, DeadLetters: 1, Batches: 1, More: true}, first)
		second, err := st.PurgeBatch(ctx, purgeOptions(2, false))
		require.NoError(t, err)
		require.Equal(t, store.PurgeResult{DiscardedMessages: 1, DeadLetters: 2, Batches: 1, More: true}, second)
		third, err := st.PurgeBatch(ctx, purgeOptions(2, false))
		require.NoError(t, err)
		require.Equal(t, store.PurgeResult{Batches: 1}, third)
		require.Zero(t, rows(t, pool, st, "outbox_messages", "true"))
		require.Zero(t, rows(t, pool, st, "outbox_dead_letters", "true"))
	})

	t.Run("ArchiveMovesRowsWithEqualContent", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		insertSent(t, pool, st, 25, sentAfter+time.Hour)
		insertSent(t, pool, st, 3, time.Hour)
		old := discarded(t, pool, st, discardedAfter+time.Hour, 2)
		orphanDeadLetter(t, pool, st, discardedAfter+time.Hour)
		untouchable(t, pool, st)

		// Every column of the rows that should move, as JSON, before and after.
		snapshot := func(table, where string) string {
			var s *string
			require.NoError(t, pool.QueryRow(ctx, fmt.Sprintf(`SELECT jsonb_agg(to_jsonb(t) - 'archived_at' ORDER BY id)::text FROM %s.%s t WHERE %s`,
				st.Schema(), table, where)).Scan(&s))
			require.NotNil(t, s, "%s has no rows where %s", table, where)
			return *s
		}
		wantMessages := snapshot("outbox_messages", "(status = 'sent' AND sent_at < now() - interval '7 days') OR status = 'discarded'")
		wantDead := snapshot("outbox_dead_letters", "discarded_at IS NOT NULL OR message_id = '"+old.String()+"'")

		total, err := st.Purge(ctx, purgeOptions(10, true))
		require.NoError(t, err)
		require.Equal(t, store.PurgeResult{SentMessages: 25, DiscardedMessages: 1, DeadLetters: 3, Batches: 3}, total)

		require.JSONEq(t, wantMessages, snapshot("outbox_messages_archive", "true"))
		require.JSONEq(t, wantDead, snapshot("outbox_dead_letters_archive", "true"))
		require.Equal(t, 26, rows(t, pool, st, "outbox_messages_archive", "archived_at > now() - interval '1 minute'"))
		require.Equal(t, 3, rows(t, pool, st, "outbox_messages", "status = 'sent'"))
		require.Zero(t, rows(t, pool, st, "outbox_messages", "status = 'discarded'"))
		require.Zero(t, rows(t, pool, st, "outbox_dead_letters", "true"))
		require.Equal(t, 4, rows(t, pool, st, "outbox_messages", "status <> 'sent'"))
	})

	t.Run("ArchiveTablesHaveEveryColumn", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		// A column added to a table but not to its archive would be lost when archiving.
		for _, table := range []string{"outbox_messages", "outbox_dead_letters"} {
			var missing []string
			rows, err := pool.Query(ctx, `SELECT column_name::text FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2
				EXCEPT SELECT column_name::text FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2 || '_archive'`,
				st.Schema(), table)
			require.NoError(t, err)
			for rows.Next() {
				var c string
				require.NoError(t, rows.Scan(&c))
				missing = append(missing, c)
			}
			require.NoError(t, rows.Err())
			require.Empty(t, missing, "columns of %s missing in %s_archive", table, table)
		}
	})

	t.Run("SkipsLockedRows", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		insertSent(t, pool, st, 5, sentAfter+time.Hour)
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		var locked int64
		require.NoError(t, tx.QueryRow(ctx, `SELECT id FROM `+st.Schema()+`.outbox_messages ORDER BY sent_at LIMIT 1 FOR UPDATE`).Scan(&locked))

		waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		total, err := st.Purge(waitCtx, purgeOptions(2, false))
		require.NoError(t, err, "a row another transaction holds does not block the purge")
		require.Equal(t, int64(4), total.SentMessages)
		require.Equal(t, 1, rows(t, pool, st, "outbox_messages", "id = $1", locked))
	})

	t.Run("InvalidOptionsNameFieldAndValue", func(t *testing.T) {
		t.Parallel()
		_, st := testdb.Schema(t)
		for _, tc := range []struct {
			opts store.PurgeOptions
			want string
		}{
			{store.PurgeOptions{DiscardedAfter: time.Hour}, "sent_after must be at least 1m0s, got 0s"},
			{store.PurgeOptions{SentAfter: time.Hour, DiscardedAfter: -time.Second}, "discarded_after must be at least 1m0s, got -1s"},
			{store.PurgeOptions{SentAfter: time.Hour, DiscardedAfter: time.Hour, Limit: -5}, "limit must be between 1 and 100000, got -5"},
		} {
			_, err := st.Purge(ctx, tc.opts)
			require.ErrorContains(t, err, tc.want)
		}
	})
}

// TestPurgeReadsFinishedIndex: the purge of sent and of discarded messages each reads
// outbox_messages_finished_idx, not the whole table, beside many rows of other statuses.
func TestPurgeReadsFinishedIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, st := testdb.Schema(t)
	exec(t, pool, `INSERT INTO `+st.Schema()+`.outbox_messages (topic, payload, status, dispatched_at)
		SELECT 't', '{}', 'dispatched', now() FROM generate_series(1, 20000)`)
	insertSent(t, pool, st, 50, sentAfter+time.Hour)
	discarded(t, pool, st, discardedAfter+time.Hour, 1)
	exec(t, pool, `ANALYZE `+st.Schema()+`.outbox_messages`)

	for name, sql := range map[string]string{"sent": st.PurgeSentSQL(), "discarded": st.PurgeDiscardedSQL()} {
		rows, err := pool.Query(ctx, `EXPLAIN `+sql, sentAfter.Seconds(), 1000)
		require.NoError(t, err, name)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err, name)
		plan := strings.Join(lines, "\n")
		require.Contains(t, plan, "outbox_messages_finished_idx", "%s:\n%s", name, plan)
		require.NotContains(t, plan, "Seq Scan on outbox_messages ", "%s:\n%s", name, plan)
	}
}

// TestPurgeSentByHand: a row marked sent in plain SQL without a sent_at is removed once its
// last update is older than SentAfter, and kept before.
func TestPurgeSentByHand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, st := testdb.Schema(t)
	exec(t, pool, `INSERT INTO `+st.Schema()+`.outbox_messages (topic, payload, status, updated_at)
		VALUES ('t', '{"old": true}', 'sent', now() - interval '8 days'), ('t', '{"old": false}', 'sent', now() - interval '6 days')`)

	res, err := st.Purge(ctx, purgeOptions(1000, false))
	require.NoError(t, err)
	require.Equal(t, store.PurgeResult{SentMessages: 1, Batches: 1}, res)
	require.Equal(t, 1, rows(t, pool, st, "outbox_messages", "payload = '{\"old\": false}'"))
}

// TestPurgeRedrivenThenSent: a message dead-lettered, redriven and then sent goes with its
// dead letter and its audit entries once it is old enough.
func TestPurgeRedrivenThenSent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, st := testdb.Schema(t)
	id, err := st.Enqueue(ctx, pool, store.Message{Topic: "t", Payload: []byte(`{}`)})
	require.NoError(t, err)
	_, err = st.DeadLetter(ctx, store.DeadLetter{MessageID: id, WorkflowID: "w", RunID: "r1", Attempts: 1, LastError: "x"})
	require.NoError(t, err)
	_, err = st.Redrive(ctx, id, "ops")
	require.NoError(t, err)
	_, err = st.MarkSent(ctx, id)
	require.NoError(t, err)
	exec(t, pool, `UPDATE `+st.Schema()+`.outbox_messages SET sent_at = now() - interval '30 days' WHERE message_id = $1`, id)

	res, err := st.Purge(ctx, purgeOptions(1000, false))
	require.NoError(t, err)
	require.Equal(t, store.PurgeResult{SentMessages: 1, DeadLetters: 1, Batches: 1}, res)
	require.Zero(t, rows(t, pool, st, "outbox_dead_letters", "message_id = $1", id))
	require.Zero(t, rows(t, pool, st, "outbox_audit", "message_id = $1", id))
}
