package mysqlstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/store/mysqlstore"
	"github.com/outbox-go/outbox/store/storedriver"
)

// TestOrderedEnqueueUnderSnapshotIsolation enqueues ordered messages in a business
// transaction at REPEATABLE READ (the server's default) that read before it enqueues,
// while another writer of the same key commits in between, with MariaDB's
// innodb_snapshot_isolation on (its default from 11.6.2): the enqueue numbers the message
// after the other writer's, as PostgreSQL's store does, instead of failing with
// "Record has changed since last read". EnqueueBatch likewise.
func TestOrderedEnqueueUnderSnapshotIsolation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := newDatabase(t)
	cfg, err := mysqlstore.ParseURL(dsn)
	require.NoError(t, err)
	db := openDB(t, dsn)
	var rows int
	r, err := db.QueryContext(ctx, `SHOW VARIABLES LIKE 'innodb_snapshot_isolation'`)
	require.NoError(t, err)
	for r.Next() {
		rows++
	}
	require.NoError(t, r.Close())
	if rows == 0 {
		t.Skip("the server has no innodb_snapshot_isolation (MySQL, or MariaDB before 10.6.18)")
	}
	cfg.Params["innodb_snapshot_isolation"] = "ON" // this pool's sessions only
	snapshots := openDB(t, cfg.FormatDSN())
	st, err := mysqlstore.New(snapshots, mysqlstore.Config{})
	require.NoError(t, err)
	_, err = st.Migrate(ctx)
	require.NoError(t, err)

	for _, batch := range []bool{false, true} {
		key := map[bool]string{false: "order-1", true: "order-2"}[batch]
		first := enqueue(t, st, snapshots, keyed("t", key, `1`))
		tx, err := snapshots.BeginTx(ctx, nil)
		require.NoError(t, err)
		var n int
		require.NoError(t, tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM outbox_messages`).Scan(&n), "the business transaction reads")
		second := enqueue(t, st, snapshots, keyed("t", key, `2`)) // another writer of the key commits
		var third storedriver.Enqueued
		if batch {
			res, err := st.EnqueueBatch(ctx, tx, []storedriver.Message{keyed("t", key, `3`), keyed("t", key, `4`)})
			require.NoError(t, err, "batch")
			third = res[0]
			require.Equal(t, third.OrderingSeq+1, res[1].OrderingSeq)
		} else {
			third, err = st.EnqueueMessage(ctx, tx, keyed("t", key, `3`))
			require.NoError(t, err)
		}
		require.NoError(t, tx.Commit())
		require.Less(t, first.OrderingSeq, second.OrderingSeq)
		require.Less(t, second.OrderingSeq, third.OrderingSeq, "numbered after the writer that committed first")
	}
}

// TestDeliverAfterInTheRepeatedHour enqueues messages from a business session in a time
// zone with daylight saving time (America/New_York, which the test's services script
// loads into the server's time zone tables), due in the hour the clocks go back, which
// that zone's local time names twice: each row holds the instant asked for, in both
// passes of the hour, on MariaDB (MySQL's store still stores the second pass an hour
// early). EnqueueBatch likewise.
func TestDeliverAfterInTheRepeatedHour(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, db := newStore(t)
	var version string
	require.NoError(t, db.QueryRowContext(ctx, `SELECT VERSION()`).Scan(&version))
	if !strings.Contains(strings.ToLower(version), "mariadb") {
		t.Skip("MySQL: a time in the repeated hour's second pass is stored an hour early")
	}
	var zones int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT COUNT(*) FROM mysql.time_zone_name WHERE Name = 'America/New_York'`).Scan(&zones))
	if zones == 0 {
		t.Skip("the server's time zone tables lack America/New_York (scripts/services.sh loads it)")
	}
	var dsn string
	require.NoError(t, db.QueryRowContext(ctx, `SELECT DATABASE()`).Scan(&dsn))
	cfg, err := mysqlstore.ParseURL(serverURL())
	require.NoError(t, err)
	cfg.DBName = dsn
	cfg.Params["time_zone"] = "'America/New_York'" // the business application's sessions
	business := openDB(t, cfg.FormatDSN())

	// 2026-11-01 01:30 in New York happens at 05:30 UTC (EDT) and again at 06:30 UTC (EST).
	first := time.Date(2026, 11, 1, 5, 30, 0, 0, time.UTC)
	second := first.Add(time.Hour)
	for _, at := range []time.Time{first, second, second.Add(1500 * time.Microsecond)} {
		for _, keyedToo := range []bool{false, true} {
			m := msg("t", `{}`)
			m.DeliverAfter = at
			if keyedToo {
				m.OrderingKey = "order-" + at.Format(time.RFC3339Nano)
			}
			res := enqueue(t, st, business, m)
			row, err := st.Get(ctx, res.MessageID)
			require.NoError(t, err)
			require.NotNil(t, row.NextRetryAt)
			require.True(t, at.Equal(*row.NextRetryAt), "due %s, stored %s", at, row.NextRetryAt.UTC())
		}
	}
	tx, err := business.BeginTx(ctx, nil)
	require.NoError(t, err)
	a, b := msg("t", `1`), msg("t", `2`)
	a.DeliverAfter, b.DeliverAfter = first, second
	res, err := st.EnqueueBatch(ctx, tx, []storedriver.Message{a, b})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	for i, at := range []time.Time{first, second} {
		row, err := st.Get(ctx, res[i].MessageID)
		require.NoError(t, err)
		require.True(t, at.Equal(*row.NextRetryAt), "batch: due %s, stored %s", at, row.NextRetryAt.UTC())
	}
}
