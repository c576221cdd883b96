package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
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

// freshSchema returns the name of a schema that does not exist yet and is dropped when the
// test ends.
func freshSchema(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	schema := fmt.Sprintf("outbox_print_%08x", rand.Uint32())
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`)
		require.NoError(t, err)
	})
	return schema
}

// migrateBefore applies to schema, by the printed SQL, the migrations before the one
// named: the schema as a team left it before that migration.
func migrateBefore(t *testing.T, pool *pgxpool.Pool, schema, name string) {
	t.Helper()
	all, err := store.MigrationSQL(schema, 1)
	require.NoError(t, err)
	before, _, ok := strings.Cut(all, "\n-- outbox migration "+name+"\n")
	require.True(t, ok, "no migration %s", name)
	_, err = pool.Exec(context.Background(), before)
	require.NoError(t, err)
}

// schemaShape describes what the migrations made in schema: tables and their options,
// columns, constraints, indexes, triggers and their state, functions, and the migrations
// recorded, with the schema's name replaced by SCHEMA.
func schemaShape(t *testing.T, pool *pgxpool.Pool, schema string) []string {
	t.Helper()
	ctx := context.Background()
	var shape []string
	for _, q := range []struct{ what, sql string }{
		{"relation", `SELECT c.relname || ' ' || c.relkind::text || ' ' || coalesce(array_to_string(c.reloptions, ','), '')
			FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = $1 ORDER BY c.relname`},
		{"column", `SELECT table_name || '.' || column_name || ' ' || ordinal_position || ' ' || data_type || ' ' ||
				is_nullable || ' ' || is_identity || ' ' || coalesce(column_default, '')
			FROM information_schema.columns WHERE table_schema = $1 ORDER BY table_name, ordinal_position`},
		{"constraint", `SELECT r.relname || ' ' || con.conname || ' ' || pg_get_constraintdef(con.oid)
			FROM pg_constraint con JOIN pg_class r ON r.oid = con.conrelid JOIN pg_namespace n ON n.oid = r.relnamespace
			WHERE n.nspname = $1 ORDER BY r.relname, con.conname`},
		{"index", `SELECT tablename || ' ' || indexname || ' ' || indexdef FROM pg_indexes
			WHERE schemaname = $1 ORDER BY tablename, indexname`},
		{"trigger", `SELECT c.relname || ' ' || t.tgname || ' ' || t.tgenabled::text || ' ' || pg_get_triggerdef(t.oid)
			FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = $1 AND NOT t.tgisinternal ORDER BY c.relname, t.tgname`},
		{"function", `SELECT pg_get_functiondef(p.oid) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
			WHERE n.nspname = $1 ORDER BY p.proname`},
		{"migration", `SELECT version || ' ' || name FROM ` + schema + `.outbox_schema_migrations WHERE $1 <> '' ORDER BY version`},
		{"deployment", `SELECT count(*) || ' row, task queue ' || coalesce(max(task_queue), 'none') FROM ` + schema + `.outbox_deployment WHERE $1 <> ''`},
	} {
		rows, err := pool.Query(ctx, q.sql, schema)
		require.NoError(t, err, q.what)
		for rows.Next() {
			var s string
			require.NoError(t, rows.Scan(&s), q.what)
			shape = append(shape, q.what+": "+strings.ReplaceAll(s, schema, "SCHEMA"))
		}
		require.NoError(t, rows.Err(), q.what)
	}
	require.NotEmpty(t, shape)
	return shape
}

// The printed SQL, run as it is (one pool.Exec, no templating), makes the schema Migrate
// makes: the same tables, indexes, triggers, functions and bookkeeping, so Migrate then
// finds nothing to apply; the outbox works on it.
func TestMigrationSQLMakesWhatMigrateMakes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, ref := testdb.Schema(t) // migrated by Store.Migrate
	schema := freshSchema(t, pool)

	sql, err := store.MigrationSQL(schema, 1)
	require.NoError(t, err)
	require.Contains(t, sql, "CREATE SCHEMA IF NOT EXISTS \""+schema+"\";\n")
	require.Contains(t, sql, "\n-- outbox migration 0001_create_outbox.up.sql\n")
	require.NotContains(t, sql, "{{")
	for _, word := range []string{"BEGIN;", "COMMIT;", "ROLLBACK;"} {
		require.NotContains(t, strings.ToUpper(sql), word, "the migration tool opens the transaction")
	}
	_, err = pool.Exec(ctx, sql)
	require.NoError(t, err)

	st, err := store.New(pool, store.Config{Schema: schema})
	require.NoError(t, err)
	applied, err := st.Migrate(ctx)
	require.NoError(t, err)
	require.Empty(t, applied, "Migrate finds every migration applied")
	require.Equal(t, schemaShape(t, pool, ref.Schema()), schemaShape(t, pool, schema))

	// The outbox works on it: enqueue, read back, claim.
	key := "order-7"
	id, err := st.Enqueue(ctx, pool, store.Message{Topic: "order.created", Payload: []byte(`{"order_id": 7}`), OrderingKey: key})
	require.NoError(t, err)
	row, err := st.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, "order.created", row.Topic)
	require.JSONEq(t, `{"order_id": 7}`, string(row.Payload))
	require.Equal(t, store.StatusPending, row.Status)
	require.NotNil(t, row.OrderingSeq, "the ordering trigger numbered the message")
	claimed, err := st.Claim(ctx, 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	require.Equal(t, id, claimed[0].MessageID)
}

// The printed SQL makes the deployment row with an ID of its own and no task queue, as
// Migrate does: the first relay or worker records its task queue, and one configured with
// another is then told the recorded one (and refuses to start), so a task queue still
// belongs to one outbox database.
func TestMigrationSQLDeployment(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	schema := freshSchema(t, pool)
	sql, err := store.MigrationSQL(schema, 1)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, sql)
	require.NoError(t, err)

	other := freshSchema(t, pool)
	_, err = pool.Exec(ctx, strings.ReplaceAll(sql, schema, other))
	require.NoError(t, err)

	st, err := store.New(pool, store.Config{Schema: schema})
	require.NoError(t, err)
	id, tq, err := st.Deployment(ctx)
	require.NoError(t, err)
	require.NotEqual(t, uuid.Nil, id)
	require.Empty(t, tq, "the printed SQL records no task queue")

	st2, err := store.New(pool, store.Config{Schema: other})
	require.NoError(t, err)
	otherID, _, err := st2.Deployment(ctx)
	require.NoError(t, err)
	require.NotEqual(t, id, otherID, "one printed script applied to two databases makes two deployments")

	gotID, recorded, err := st.RecordTaskQueue(ctx, "orders") // the first relay or worker
	require.NoError(t, err)
	require.Equal(t, id, gotID)
	require.Equal(t, "orders", recorded)
	_, recorded, err = st.RecordTaskQueue(ctx, "billing") // a relay or worker configured otherwise
	require.NoError(t, err)
	require.Equal(t, "orders", recorded, "the first task queue recorded stays")
}

// A schema migrated up to version N-1 (by the printed SQL or by Migrate) reaches the
// latest version with the SQL printed from N, and ends as Migrate makes it.
func TestMigrationSQLFrom(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, ref := testdb.Schema(t)
	want := schemaShape(t, pool, ref.Schema())
	migrations, err := store.Migrations()
	require.NoError(t, err)
	last := migrations[len(migrations)-1].Version

	for _, m := range migrations[1:] {
		t.Run(m.Name, func(t *testing.T) {
			t.Parallel()
			schema := freshSchema(t, pool)
			// The schema as a team left it after applying the migrations before m.
			migrateBefore(t, pool, schema, m.Name)

			rest, err := store.MigrationSQL(schema, m.Version)
			require.NoError(t, err)
			require.NotContains(t, rest, fmt.Sprintf("VALUES (%d, ", m.Version-1), "only migrations from %d", m.Version)
			require.Contains(t, rest, fmt.Sprintf("VALUES (%d, ", last))
			_, err = pool.Exec(ctx, rest)
			require.NoError(t, err)

			st, err := store.New(pool, store.Config{Schema: schema})
			require.NoError(t, err)
			applied, err := st.Migrate(ctx)
			require.NoError(t, err)
			require.Empty(t, applied)
			require.Equal(t, want, schemaShape(t, pool, schema))
		})
	}

	// Partly migrated by the printed SQL, the rest by Migrate: it applies exactly the rest.
	schema := freshSchema(t, pool)
	migrateBefore(t, pool, schema, migrations[4].Name)
	st, err := store.New(pool, store.Config{Schema: schema})
	require.NoError(t, err)
	applied, err := st.Migrate(ctx)
	require.NoError(t, err)
	var rest []int
	for _, m := range migrations[4:] {
		rest = append(rest, m.Version)
	}
	require.Equal(t, rest, applied)
	require.Equal(t, want, schemaShape(t, pool, schema))

	// Applying the printed SQL again fails (what it creates and records exists) rather than
	// passing silently.
	again, err := store.MigrationSQL(schema, last)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, again)
	require.Error(t, err)
}

func TestMigrationSQLRefuses(t *testing.T) {
	t.Parallel()
	migrations, err := store.Migrations()
	require.NoError(t, err)
	last := migrations[len(migrations)-1].Version

	_, err = store.MigrationSQL("outbox", 0)
	require.ErrorContains(t, err, fmt.Sprintf("from version 0: the versions are 1 to %d", last))
	_, err = store.MigrationSQL("outbox", last+1)
	require.ErrorContains(t, err, fmt.Sprintf("from version %d: the versions are 1 to %d", last+1, last))
	_, err = store.MigrationSQL(`Bad"Schema`, 1)
	require.ErrorContains(t, err, `got "Bad\"Schema"`)

	def, err := store.MigrationSQL("", 1)
	require.NoError(t, err)
	require.Contains(t, def, `CREATE SCHEMA IF NOT EXISTS "public";`)
	require.Contains(t, def, `'public.outbox_messages'`, "the NOTIFY channel of the schema")
}

// TestMigration0015KeepsRows: migration 0015 rewrites constraints and replaces retention's
// indexes on a table that holds rows in every status; the rows stay as they were, and
// retention removes the old sent and discarded ones through the new index.
func TestMigration0015KeepsRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testdb.Schema(t)
	schema := freshSchema(t, pool)
	migrateBefore(t, pool, schema, "0015_cheaper_insert.up.sql")
	_, err := pool.Exec(ctx, `INSERT INTO `+schema+`.outbox_messages
		(topic, payload, status, ordering_key, next_retry_at, lease_until, claim_token, sent_at, updated_at, max_retry_times) VALUES
		('t', '{"n": 1}', 'pending', NULL, NULL, NULL, NULL, NULL, now(), NULL),
		('t', '{"n": 2}', 'pending', 'order-7', now() + interval '1 hour', NULL, NULL, NULL, now(), 100),
		('t', '{"n": 3}', 'claimed', NULL, NULL, now() + interval '30 seconds', gen_random_uuid(), NULL, now(), 0),
		('t', '{"n": 4}', 'dispatched', 'order-8', NULL, NULL, NULL, NULL, now(), NULL),
		('t', '{"n": 5}', 'sent', NULL, NULL, NULL, NULL, now() - interval '8 days', now() - interval '8 days', NULL),
		('t', '{"n": 6}', 'sent', NULL, NULL, NULL, NULL, now() - interval '1 day', now() - interval '1 day', NULL),
		('t', '{"n": 7}', 'dead', NULL, NULL, NULL, NULL, NULL, now() - interval '40 days', NULL),
		('t', '{"n": 8}', 'discarded', NULL, NULL, NULL, NULL, NULL, now() - interval '31 days', NULL)`)
	require.NoError(t, err)
	rowsAsText := func() []string {
		rows, err := pool.Query(ctx, `SELECT m::text FROM `+schema+`.outbox_messages m ORDER BY id`)
		require.NoError(t, err)
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return got
	}
	want := rowsAsText()

	rest, err := store.MigrationSQL(schema, 15)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, rest)
	require.NoError(t, err)
	require.Equal(t, want, rowsAsText(), "the rows are untouched")

	st, err := store.New(pool, store.Config{Schema: schema})
	require.NoError(t, err)
	res, err := st.Purge(ctx, purgeOptions(100, false))
	require.NoError(t, err)
	require.EqualValues(t, 1, res.SentMessages)
	require.EqualValues(t, 1, res.DiscardedMessages)
	rows, err := pool.Query(ctx, `SELECT (payload->>'n')::int FROM `+schema+`.outbox_messages ORDER BY id`)
	require.NoError(t, err)
	left, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	require.Equal(t, []int{1, 2, 3, 4, 6, 7}, left)
}
