package mysqlstore_test

import (
	"context"
	"testing"

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
