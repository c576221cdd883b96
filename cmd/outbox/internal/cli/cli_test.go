package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/cmd/outbox/internal/cli"
	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
)

type result struct {
	stdout, stderr string
	err            error
}

func run(t *testing.T, env map[string]string, stdin string, args ...string) result {
	t.Helper()
	return runReading(t, env, strings.NewReader(stdin), args...)
}

// runReading is run with stdin read from a reader of the test's.
func runReading(t *testing.T, env map[string]string, stdin io.Reader, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	root := cli.NewRoot(stdin, &stdout, &stderr, func(k string) (string, bool) {
		v, ok := env[k]
		return v, ok
	})
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return result{stdout.String(), stderr.String(), err}
}

// setup writes a config file for a fresh schema that is dropped when the test ends.
func setup(t *testing.T) (cfgPath, schema string, env map[string]string) {
	t.Helper()
	pool := testdb.Pool(t)
	schema = fmt.Sprintf("outbox_cli_%08x", rand.Uint32())
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) })
	cfgPath = filepath.Join(t.TempDir(), "outbox.yaml")
	require.NoError(t, os.WriteFile(cfgPath, []byte("schema: "+schema+"\ndatabase_url: postgres://nobody@127.0.0.1:1/none\n"), 0o600))
	return cfgPath, schema, map[string]string{"DATABASE_URL": testdb.URL()}
}

func TestMigrateAndEnqueue(t *testing.T) {
	t.Parallel()
	cfg, schema, env := setup(t)

	r := run(t, env, "", "migrate", "--config", cfg)
	require.NoError(t, r.err)
	migrations, err := store.Migrations()
	require.NoError(t, err)
	var want strings.Builder
	for _, m := range migrations {
		fmt.Fprintf(&want, "applied migration %04d to schema %s\n", m.Version, schema)
	}
	deployed := regexp.MustCompile(`^deployment [0-9a-f-]{36}, task queue outbox\n$`)
	require.True(t, strings.HasPrefix(r.stdout, want.String()), r.stdout)
	require.Regexp(t, deployed, strings.TrimPrefix(r.stdout, want.String()), "migrate records the config's task queue")
	r = run(t, env, "", "migrate", "--config", cfg)
	require.NoError(t, r.err)
	require.True(t, strings.HasPrefix(r.stdout, "schema "+schema+" is up to date\n"), r.stdout)
	first := strings.TrimPrefix(r.stdout, "schema "+schema+" is up to date\n")
	require.Regexp(t, deployed, first)

	// Another task queue in the config keeps the recorded one, unless moved.
	env2 := map[string]string{"DATABASE_URL": env["DATABASE_URL"], "OUTBOX_TASK_QUEUE": "orders"}
	r = run(t, env2, "", "migrate", "--config", cfg)
	require.NoError(t, r.err)
	require.Contains(t, r.stdout, first)
	r = run(t, env2, "", "migrate", "--config", cfg, "--move-task-queue")
	require.NoError(t, r.err)
	require.Contains(t, r.stdout, strings.Replace(first, "task queue outbox", "task queue orders", 1), "the same deployment, on the moved task queue")

	r = run(t, env, `{"order_id": 7}`, "enqueue", "order.created", "--config", cfg, "--max-retry-times", "2", "--header", "traceparent=00-1")
	require.NoError(t, r.err)
	id, err := uuid.Parse(strings.TrimSpace(r.stdout))
	require.NoError(t, err)

	pool := testdb.Pool(t)
	var topic, payload string
	var maxRetry int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT topic, payload::text, max_retry_times FROM `+schema+`.outbox_messages WHERE message_id = $1`, id).
		Scan(&topic, &payload, &maxRetry))
	require.Equal(t, "order.created", topic)
	require.JSONEq(t, `{"order_id": 7}`, payload)
	require.Equal(t, 2, maxRetry)

	r = run(t, env, "", "enqueue", "order.created", "--config", cfg, "--payload", `{"a": "\u0000"}`)
	require.ErrorContains(t, r.err, `payload must not contain \u0000`)
	r = run(t, env, "", "enqueue", "Order Created", "--config", cfg, "--payload", `{}`)
	require.ErrorContains(t, r.err, `topic must match`)
	require.ErrorContains(t, r.err, `got "Order Created"`)
	r = run(t, env, "", "enqueue", "a", "--config", cfg, "--payload", `{}`, "--max-retry-times", "101")
	require.ErrorContains(t, r.err, `--max-retry-times must be between 0 and 100, got 101`)
	require.Equal(t, cli.ExitUsage, cli.ExitCode(r.err))
	r = run(t, env, "", "enqueue", "a", "--config", cfg, "--payload", `{}`, "--deliver-after", "9000h")
	require.ErrorContains(t, r.err, `--deliver-after must be between 0 and 8760h0m0s (a year), got 9000h0m0s`)
	require.Equal(t, cli.ExitUsage, cli.ExitCode(r.err))
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM `+schema+`.outbox_messages`).Scan(&n))
	require.Equal(t, 1, n, "rejected messages write nothing")
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("relay:\n  lease: 10ms\ntopics:\n  a:\n    url: nope\n"), 0o600))

	r := run(t, nil, "", "migrate", "--config", bad)
	require.ErrorContains(t, r.err, "relay.lease: must be at least 1s, got 10ms")
	require.ErrorContains(t, r.err, `topics["a"].url: must be an absolute http or https URL, got "(unparsable URL)"`)

	r = run(t, nil, "", "migrate", "--config", filepath.Join(dir, "missing.yaml"))
	require.ErrorContains(t, r.err, "missing.yaml")

	r = run(t, nil, "", "migrate", "--log-level", "loud")
	require.ErrorContains(t, r.err, `--log-level must be debug, info, warn or error, got "loud"`)

	r = run(t, nil, "", "enqueue", "a", "--payload", "{}", "--header", "novalue")
	require.ErrorContains(t, r.err, `--header must be key=value, got "novalue"`)
}

func TestDatabasePasswordNotShown(t *testing.T) {
	t.Parallel()
	const secret = "s3cr3t-pw"
	r := run(t, map[string]string{"DATABASE_URL": "postgres://app:" + secret + "@127.0.0.1:1/app?connect_timeout=2"}, "", "migrate")
	require.Error(t, r.err)
	require.NotContains(t, r.err.Error()+r.stdout+r.stderr, secret)
	require.Contains(t, r.err.Error(), "127.0.0.1")
}
