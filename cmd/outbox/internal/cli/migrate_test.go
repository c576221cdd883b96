package cli_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-go/outbox/cmd/outbox/internal/cli"
	"github.com/outbox-go/outbox/internal/testdb"
	"github.com/outbox-go/outbox/store"
)

// noDatabase points at a port where nothing listens: migrate --print must not connect.
var noDatabase = map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1:1/y"}

// migrate --print prints the SQL for the config's schema without a database.
func TestMigratePrint(t *testing.T) {
	t.Parallel()
	cfg := filepath.Join(t.TempDir(), "outbox.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("schema: billing_outbox\n"), 0o600))
	migrations, err := store.Migrations()
	require.NoError(t, err)
	last := migrations[len(migrations)-1]

	r := run(t, noDatabase, "", "migrate", "--print", "--config", cfg)
	require.NoError(t, r.err)
	want, err := store.MigrationSQL("billing_outbox", 1)
	require.NoError(t, err)
	require.Equal(t, want, r.stdout)
	require.Contains(t, r.stdout, `CREATE SCHEMA IF NOT EXISTS "billing_outbox";`)
	require.Contains(t, r.stdout, `CREATE TABLE "billing_outbox".outbox_messages (`)
	require.Contains(t, r.stdout, `'billing_outbox.outbox_messages'`)
	for _, m := range migrations {
		require.Contains(t, r.stdout, "\n-- outbox migration "+m.Name+"\n")
		require.Contains(t, r.stdout, fmt.Sprintf(`INSERT INTO "billing_outbox"."outbox_schema_migrations" (version, name) VALUES (%d, '%s');`, m.Version, m.Name))
	}

	r = run(t, noDatabase, "", "migrate", "--print", "--config", cfg, "--from", fmt.Sprint(last.Version))
	require.NoError(t, r.err)
	require.Equal(t, 1, strings.Count(r.stdout, "\n-- outbox migration "), r.stdout)
	require.Contains(t, r.stdout, "\n-- outbox migration "+last.Name+"\n")

	// Without a config file, the default schema; without DATABASE_URL at all too.
	r = run(t, nil, "", "migrate", "--print")
	require.NoError(t, r.err)
	require.Contains(t, r.stdout, `CREATE SCHEMA IF NOT EXISTS "public";`)
}

func TestMigratePrintRefuses(t *testing.T) {
	t.Parallel()
	migrations, err := store.Migrations()
	require.NoError(t, err)
	last := migrations[len(migrations)-1].Version
	badSchema := filepath.Join(t.TempDir(), "outbox.yaml")
	require.NoError(t, os.WriteFile(badSchema, []byte("schema: Billing\n"), 0o600))

	for _, tc := range []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"FromZero", []string{"migrate", "--print", "--from", "0"}, cli.ExitUsage, fmt.Sprintf("--from must be a migration version from 1 to %d, got 0", last)},
		{"FromPastLast", []string{"migrate", "--print", "--from", "99"}, cli.ExitUsage, fmt.Sprintf("--from must be a migration version from 1 to %d, got 99", last)},
		{"FromNotANumber", []string{"migrate", "--print", "--from", "latest"}, cli.ExitUsage, `invalid argument "latest" for "--from"`},
		{"FromWithoutPrint", []string{"migrate", "--from", "3"}, cli.ExitUsage, "--from 3 needs --print"},
		{"PrintAndMove", []string{"migrate", "--print", "--move-task-queue"}, cli.ExitUsage, "--move-task-queue writes to the database and cannot be used with --print"},
		{"BadSchema", []string{"migrate", "--print", "--config", badSchema}, cli.ExitConfig, `got "Billing"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := run(t, noDatabase, "", tc.args...)
			require.ErrorContains(t, r.err, tc.msg)
			require.Equal(t, tc.code, cli.ExitCode(r.err), "outbox %s: %v", strings.Join(tc.args, " "), r.err)
			require.Empty(t, r.stdout)
		})
	}
}

// A schema made by applying the printed SQL with another tool is one outbox migrate finds
// up to date; it records the config's task queue on the deployment the SQL made.
func TestMigratePrintThenMigrate(t *testing.T) {
	t.Parallel()
	cfg, schema, env := setup(t)
	r := run(t, noDatabase, "", "migrate", "--print", "--config", cfg)
	require.NoError(t, r.err)
	_, err := testdb.Pool(t).Exec(context.Background(), r.stdout)
	require.NoError(t, err)

	r = run(t, env, "", "migrate", "--config", cfg)
	require.NoError(t, r.err)
	require.Regexp(t, regexp.MustCompile(`^schema `+schema+` is up to date\ndeployment [0-9a-f-]{36}, task queue outbox\n$`), r.stdout)
}
