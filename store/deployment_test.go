package store_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
)

// Each outbox schema is a deployment with an ID of its own, made at migrate and kept by
// a second migrate; the first task queue recorded stays until it is moved.
func TestDeployment(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, st := testdb.Schema(t)
	_, other := testdb.Schema(t)

	id, tq, err := st.Deployment(ctx)
	require.NoError(t, err)
	require.NotEqual(t, uuid.Nil, id)
	require.Empty(t, tq, "no task queue is recorded at migrate by the store alone")

	otherID, _, err := other.Deployment(ctx)
	require.NoError(t, err)
	require.NotEqual(t, id, otherID, "two schemas are two deployments")

	_, err = st.Migrate(ctx)
	require.NoError(t, err)
	again, err := st.DeploymentID(ctx)
	require.NoError(t, err)
	require.Equal(t, id, again, "migrating again keeps the deployment ID")

	gotID, recorded, err := st.RecordTaskQueue(ctx, "orders")
	require.NoError(t, err)
	require.Equal(t, id, gotID)
	require.Equal(t, "orders", recorded)
	_, recorded, err = st.RecordTaskQueue(ctx, "billing")
	require.NoError(t, err)
	require.Equal(t, "orders", recorded, "the first task queue recorded stays")

	require.NoError(t, st.MoveTaskQueue(ctx, "billing"))
	_, tq, err = st.Deployment(ctx)
	require.NoError(t, err)
	require.Equal(t, "billing", tq)

	// A second store on the same schema (another process) reads the same deployment.
	st2, err := store.New(pool, store.Config{Schema: st.Schema()})
	require.NoError(t, err)
	id2, err := st2.DeploymentID(ctx)
	require.NoError(t, err)
	require.Equal(t, id, id2)

	// One row only.
	_, err = pool.Exec(ctx, `INSERT INTO `+st.Schema()+`.outbox_deployment (singleton) VALUES (true)`)
	require.Error(t, err)
}

// A schema that predates migration 0010 has no deployment, and the error says to migrate.
func TestDeploymentMissing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, st := testdb.Schema(t)
	_, err := pool.Exec(ctx, `DROP TABLE `+st.Schema()+`.outbox_deployment`)
	require.NoError(t, err)
	_, _, err = st.Deployment(ctx)
	require.Error(t, err)
	require.True(t, store.IsDeploymentMissing(err))
	require.ErrorIs(t, err, store.ErrNotMigrated)
	require.Contains(t, err.Error(), "outbox migrate")

	// Its row deleted: the same.
	pool, st = testdb.Schema(t)
	_, err = pool.Exec(ctx, `DELETE FROM `+st.Schema()+`.outbox_deployment`)
	require.NoError(t, err)
	_, _, err = st.Deployment(ctx)
	require.ErrorIs(t, err, store.ErrNotMigrated)
	require.Contains(t, err.Error(), "outbox migrate")
}
