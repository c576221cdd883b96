package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/internal/testdb"
)

func TestRetentionRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, st := testdb.Schema(t)
	insert := func(n int, sentAgo string) {
		t.Helper()
		_, err := pool.Exec(ctx, `INSERT INTO `+st.Schema()+`.outbox_messages (topic, payload, status, sent_at)
			SELECT 'order.created', '{}', 'sent', now() - $2::interval FROM generate_series(1, $1)`, n, sentAgo)
		require.NoError(t, err)
	}
	count := func(table string) int {
		t.Helper()
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+st.Schema()+`.`+table).Scan(&n))
		return n
	}
	run := func(config string, args ...string) (string, error) {
		t.Helper()
		path := filepath.Join(t.TempDir(), "outbox.yaml")
		require.NoError(t, os.WriteFile(path, []byte("schema: "+st.Schema()+"\n"+config), 0o600))
		var out bytes.Buffer
		g := &globals{configPath: path, logLevel: "error", logFormat: "text", stdin: strings.NewReader(""), stdout: &out, stderr: &out,
			lookupEnv: func(k string) (string, bool) {
				if k == "DATABASE_URL" {
					return testdb.URL(), true
				}
				return "", false
			}}
		cmd := newRetentionCmd(g)
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(args)
		err := cmd.ExecuteContext(ctx)
		return out.String(), err
	}

	insert(5, "8 days")
	insert(2, "1 hour")
	out, err := run("retention:\n  batch_size: 2\n", "run")
	require.NoError(t, err, out)
	require.Equal(t, "deleted 5 sent messages, 0 discarded messages, 0 dead letters (3 batches)\n", out)
	require.Equal(t, 2, count("outbox_messages"))

	insert(3, "2 days")
	out, err = run("retention:\n  sent_after: 24h\n  archive: true\n", "run", "--json")
	require.NoError(t, err, out)
	var got map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	require.Equal(t, map[string]any{"archive": true, "sent_messages": 3.0, "discarded_messages": 0.0, "dead_letters": 0.0, "batches": 1.0}, got)
	require.Equal(t, 3, count("outbox_messages_archive"))
	require.Equal(t, 2, count("outbox_messages"))

	_, err = run("retention:\n  batch_size: -1\n", "run")
	require.ErrorContains(t, err, "retention.batch_size: must be between 1 and 100000, got -1")
}
