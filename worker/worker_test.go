package worker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
	"github.com/outbox-go/outbox/worker"
)

// A database that answers that the outbox's migrations are missing is an error at once:
// waiting for it, as for a database that does not answer, would never end.
func TestCheckTaskQueueRefusesADatabaseWithoutMigrations(t *testing.T) {
	t.Parallel()
	for name, ddl := range map[string]string{
		"NoDeploymentTable": `DROP TABLE %s.outbox_deployment`,
		"NoDeploymentRow":   `DELETE FROM %s.outbox_deployment`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool, st := testdb.Schema(t)
			_, err := pool.Exec(context.Background(), fmt.Sprintf(ddl, st.Schema()))
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, err = worker.CheckTaskQueue(ctx, nil, st, "outbox", nil)
			require.ErrorIs(t, err, store.ErrNotMigrated)
			require.Contains(t, err.Error(), "outbox migrate")
			require.NoError(t, ctx.Err(), "refused at once, not after waiting")
		})
	}
}
