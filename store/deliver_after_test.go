package store_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
)

func TestDeliverAfter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("NotClaimedBeforeItsTime", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		at := time.Now().Add(time.Hour)
		m := msg("t", `{}`)
		m.DeliverAfter = at
		delayed, err := st.Enqueue(ctx, pool, m)
		require.NoError(t, err)
		now, err := st.Enqueue(ctx, pool, msg("t", `{}`))
		require.NoError(t, err)

		row, err := st.Get(ctx, delayed)
		require.NoError(t, err)
		require.Equal(t, store.StatusPending, row.Status)
		require.NotNil(t, row.NextRetryAt)
		require.WithinDuration(t, at, *row.NextRetryAt, time.Millisecond, "DeliverAfter is stored as next_retry_at")
		row, err = st.Get(ctx, now)
		require.NoError(t, err)
		require.Nil(t, row.NextRetryAt, "no DeliverAfter, no next_retry_at")

		claimed, err := st.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Len(t, claimed, 1)
		require.Equal(t, now, claimed[0].MessageID)

		wait, ok, err := st.NextDue(ctx)
		require.NoError(t, err)
		require.True(t, ok)
		require.InDelta(t, time.Hour.Seconds(), wait.Seconds(), 10, "wait %s", wait)
	})

	t.Run("DueOnceItsTimeHasPassed", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		m := msg("t", `{}`)
		m.DeliverAfter = time.Now().Add(time.Hour)
		id, err := st.Enqueue(ctx, pool, m)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `UPDATE `+st.Schema()+`.outbox_messages SET next_retry_at = now() - interval '1 second'`)
		require.NoError(t, err)

		_, ok, err := st.NextDue(ctx)
		require.NoError(t, err)
		require.False(t, ok, "a message already due is left to the claim")
		claimed, err := st.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Len(t, claimed, 1)
		require.Equal(t, id, claimed[0].MessageID)
	})

	t.Run("PastTimeIsDueAtOnce", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		m := msg("t", `{}`)
		m.DeliverAfter = time.Now().Add(-time.Hour)
		id, err := st.Enqueue(ctx, pool, m)
		require.NoError(t, err)
		claimed, err := st.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Len(t, claimed, 1)
		require.Equal(t, id, claimed[0].MessageID)
	})

	t.Run("NextDueIsTheEarliestPendingOne", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		_, ok, err := st.NextDue(ctx)
		require.NoError(t, err)
		require.False(t, ok, "empty table")

		for _, d := range []time.Duration{2 * time.Hour, 10 * time.Minute, time.Hour} {
			m := msg("t", `{}`)
			m.DeliverAfter = time.Now().Add(d)
			_, err := st.Enqueue(ctx, pool, m)
			require.NoError(t, err)
		}
		// Rows that are not pending do not count, whatever their next_retry_at.
		_, err = pool.Exec(ctx, `INSERT INTO `+st.Schema()+`.outbox_messages (topic, payload, status, next_retry_at, sent_at)
			VALUES ('t', '{}', 'sent', now() + interval '1 minute', now())`)
		require.NoError(t, err)

		wait, ok, err := st.NextDue(ctx)
		require.NoError(t, err)
		require.True(t, ok)
		require.InDelta(t, (10 * time.Minute).Seconds(), wait.Seconds(), 10, "wait %s", wait)
	})

	t.Run("MoreThanAYearAheadIsRejected", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		m := msg("t", `{}`)
		m.DeliverAfter = time.Now().AddDate(2, 0, 0)
		_, err := st.Enqueue(ctx, pool, m)
		var verr *store.ValidationError
		require.ErrorAs(t, err, &verr)
		require.Equal(t, "deliver_after", verr.Field)
		require.Contains(t, err.Error(), "deliver_after must be at most 1 year ahead, got "+m.DeliverAfter.Format(time.RFC3339))
		require.Zero(t, count(t, pool, st, "true"), "nothing was written")

		m.DeliverAfter = time.Now().AddDate(1, 0, -1)
		_, err = st.Enqueue(ctx, pool, m)
		require.NoError(t, err, "just under a year is accepted")
	})

	t.Run("PlainSQLNextRetryAt", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		_, err := pool.Exec(ctx, `INSERT INTO `+st.Schema()+`.outbox_messages (topic, payload, next_retry_at)
			VALUES ('order.created', '{"order_id": 7}', now() + interval '30 minutes')`)
		require.NoError(t, err)
		claimed, err := st.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Empty(t, claimed)
		wait, ok, err := st.NextDue(ctx)
		require.NoError(t, err)
		require.True(t, ok)
		require.InDelta(t, (30 * time.Minute).Seconds(), wait.Seconds(), 10, "wait %s", wait)

		_, err = pool.Exec(ctx, `UPDATE `+st.Schema()+`.outbox_messages SET next_retry_at = now()`)
		require.NoError(t, err)
		claimed, err = st.Claim(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Len(t, claimed, 1)
		require.Equal(t, "order.created", claimed[0].Topic)
	})

	t.Run("ExplainUsesClaimDelayedIndex", func(t *testing.T) {
		t.Parallel()
		pool, st := testdb.Schema(t)
		// Many sent rows that once had a time, and a few pending ones, delayed or not.
		_, err := pool.Exec(ctx, `INSERT INTO `+st.Schema()+`.outbox_messages (topic, payload, status, next_retry_at, sent_at)
			SELECT 't', '{}', 'sent', now() - interval '1 day', now() FROM generate_series(1, 20000)`)
		require.NoError(t, err)
		for i := range 10 {
			m := msg("t", `{}`)
			if i%2 == 0 {
				m.DeliverAfter = time.Now().Add(time.Duration(i+1) * time.Minute)
			}
			_, err := st.Enqueue(ctx, pool, m)
			require.NoError(t, err)
		}
		_, err = pool.Exec(ctx, `ANALYZE `+st.Schema()+`.outbox_messages`)
		require.NoError(t, err)

		rows, err := pool.Query(ctx, `EXPLAIN `+st.NextDueSQL())
		require.NoError(t, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		plan := strings.Join(lines, "\n")
		require.Contains(t, plan, "outbox_messages_claim_delayed_idx", plan)
		require.NotContains(t, plan, "Seq Scan", plan)
	})
}
