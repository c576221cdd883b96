package e2e

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/internal/testutil"
	"github.com/outbox-go/outbox/workflows"
)

// TestDevTemporalOnPostgres runs `outbox dev --only temporal --temporal-postgres URL` as a
// benchmark against a production-shaped server does: the server's state in two PostgreSQL
// databases it creates, with their schemas, the namespace and the outbox's search
// attributes; a workflow with a search attribute runs; after SIGINT and a restart on the
// same databases the schemas are left alone and the first workflow is still there.
func TestDevTemporalOnPostgres(t *testing.T) {
	t.Parallel()
	bin, err := buildOutbox()
	require.NoError(t, err)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, testdb.URL())
	require.NoError(t, err)
	t.Cleanup(func() { admin.Close(context.Background()) })

	name := fmt.Sprintf("outbox_e2e_temporal_%d", time.Now().UnixNano()%1_000_000_000)
	drop := func() {
		for _, db := range []string{name, name + "_visibility"} {
			_, err := admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)")
			require.NoError(t, err)
		}
	}
	t.Cleanup(drop)
	u, err := url.Parse(testdb.URL())
	require.NoError(t, err)
	u.Path = "/" + name

	ports := testutil.FreePorts(t, 4)
	args := []string{"--only", "temporal", "--dir", devDir(t), "--temporal-postgres", u.String(),
		"--port", strconv.Itoa(ports[0]), "--history-port", strconv.Itoa(ports[1]),
		"--matching-port", strconv.Itoa(ports[2]), "--worker-port", strconv.Itoa(ports[3]), "--ui-port", "0"}
	frontend := fmt.Sprintf("127.0.0.1:%d", ports[0])

	p := startDev(t, bin, devEnv(), args...)
	p.waitReady(t)
	require.Contains(t, p.stdout.String(), name+"_visibility", "the summary names the databases")
	runTrivialWorkflow(t, frontend, "first")
	updates := schemaUpdates(t, u.String())
	require.Positive(t, updates)
	p.interrupt(t, 30*time.Second)

	p = startDev(t, bin, devEnv(), args...)
	p.waitReady(t)
	require.Equal(t, updates, schemaUpdates(t, u.String()), "a restart runs no schema update")
	c, err := client.Dial(client.Options{HostPort: frontend, Namespace: "default"})
	require.NoError(t, err)
	defer c.Close()
	_, err = c.DescribeWorkflowExecution(ctx, "first", "")
	require.NoError(t, err, "the first start's workflow survives the restart")
	runTrivialWorkflow(t, frontend, "second")
	p.interrupt(t, 30*time.Second)
}

// runTrivialWorkflow runs one workflow that carries an outbox search attribute to its end.
func runTrivialWorkflow(t *testing.T, frontend, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Dial(client.Options{HostPort: frontend, Namespace: "default"})
	require.NoError(t, err)
	defer c.Close()
	queue := "trivial-" + id
	w := sdkworker.New(c, queue, sdkworker.Options{})
	w.RegisterWorkflowWithOptions(func(workflow.Context) (string, error) { return "done", nil }, workflow.RegisterOptions{Name: "Trivial"})
	require.NoError(t, w.Start())
	defer w.Stop()
	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: queue,
		TypedSearchAttributes: temporal.NewSearchAttributes(temporal.NewSearchAttributeKeyKeyword(workflows.SearchAttrTopic).ValueSet("test"))}, "Trivial")
	require.NoError(t, err)
	var out string
	require.NoError(t, run.Get(ctx, &out))
	require.Equal(t, "done", out)
}

// schemaUpdates counts the schema updates the Temporal server's tooling recorded in the
// database of dbURL.
func schemaUpdates(t *testing.T, dbURL string) int {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dbURL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var n int
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT count(*) FROM schema_update_history`).Scan(&n))
	return n
}
