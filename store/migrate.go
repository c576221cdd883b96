package store

import (
	"context"
	"embed"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

//go:embed migrations/*.up.sql
var migrationFiles embed.FS

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) { return ReadMigrations(migrationFiles, "migrations") }

// Migrate creates the schema if needed and applies the migrations it has not applied yet,
// in one transaction under an advisory lock, so concurrent callers are safe and running it
// again is a no-op. It returns the versions it applied. It runs the statements
// [MigrationSQL] prints.
func (s *Store) Migrate(ctx context.Context) ([]int, error) {
	script, err := newMigrationScript(s.cfg.Schema)
	if err != nil {
		return nil, err
	}
	var applied []int
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, script.lock); err != nil {
			return fmt.Errorf("take migration lock: %w", err)
		}
		if _, err := tx.Exec(ctx, script.createSchema); err != nil {
			return fmt.Errorf("create schema %s: %w", script.schema, err)
		}
		if _, err := tx.Exec(ctx, script.createTable); err != nil {
			return fmt.Errorf("create migrations table: %w", err)
		}
		done := map[int]bool{}
		rows, err := tx.Query(ctx, `SELECT version FROM `+script.table)
		if err != nil {
			return fmt.Errorf("read applied migrations: %w", err)
		}
		versions, err := pgx.CollectRows(rows, pgx.RowTo[int])
		if err != nil {
			return fmt.Errorf("read applied migrations: %w", err)
		}
		for _, v := range versions {
			done[v] = true
		}
		for _, step := range script.steps {
			if done[step.Version] {
				continue
			}
			if _, err := tx.Exec(ctx, step.apply); err != nil {
				return fmt.Errorf("apply migration %s: %w", step.Name, err)
			}
			if _, err := tx.Exec(ctx, step.record); err != nil {
				return fmt.Errorf("record migration %s: %w", step.Name, err)
			}
			applied = append(applied, step.Version)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("migrate schema %q: %w", s.cfg.Schema, err)
	}
	return applied, nil
}

// MigrationSQL returns, as one plain SQL script, what Migrate runs on schema ("" is
// "public") for the migrations from version from on (1 gives them all): it takes the
// migration lock and creates the schema and the outbox_schema_migrations table if they do
// not exist, then, for each migration, a comment naming its file, its SQL with the schema
// and the NOTIFY channel ([Channel]) filled in, and the INSERT into
// outbox_schema_migrations that records it as applied. A schema migrated with the script
// is the one Migrate makes, and a later Migrate finds nothing to apply.
//
// The script has no BEGIN or COMMIT: run it in one transaction, the one a migration tool
// opens around each migration or an explicit one. It does not record a task queue on the
// deployment (see [Store.RecordTaskQueue]): the first relay or worker to start records
// its own, as after Migrate.
func MigrationSQL(schema string, from int) (string, error) {
	script, err := newMigrationScript(schema)
	if err != nil {
		return "", err
	}
	first, last := script.steps[0].Version, script.steps[len(script.steps)-1].Version
	if from < first || from > last {
		return "", fmt.Errorf("migration SQL from version %d: the versions are %d to %d", from, first, last)
	}
	var b strings.Builder
	versions := fmt.Sprintf("migrations %04d to %04d", from, last)
	if from == last {
		versions = fmt.Sprintf("migration %04d", last)
	}
	fmt.Fprintf(&b, "-- outbox %s for schema %s, with the rows of\n", versions, script.schema)
	fmt.Fprintf(&b, "-- outbox_schema_migrations that record them. Run it in one transaction.\n")
	for _, stmt := range []string{script.lock, script.createSchema, script.createTable} {
		b.WriteString(stmt + ";\n")
	}
	for _, step := range script.steps {
		if step.Version < from {
			continue
		}
		fmt.Fprintf(&b, "\n-- outbox migration %s\n", step.Name)
		b.WriteString(strings.TrimSpace(step.apply) + "\n")
		b.WriteString(step.record + ";\n")
	}
	return b.String(), nil
}

// migrationScript holds the statements that migrate one schema: Migrate runs them and
// MigrationSQL prints them, so the two cannot differ.
type migrationScript struct {
	schema string // the schema, quoted
	table  string // outbox_schema_migrations, quoted and schema-qualified

	lock         string // takes the schema's migration lock until the transaction ends
	createSchema string
	createTable  string // the table that records the migrations applied
	steps        []migrationStep
}

// migrationStep is one migration: its SQL with the placeholders filled in, and the INSERT
// that records it as applied.
type migrationStep struct {
	Migration
	apply, record string
}

func newMigrationScript(schema string) (*migrationScript, error) {
	cfg := Config{Schema: schema}.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	migrations, err := Migrations()
	if err != nil {
		return nil, err
	}
	if len(migrations) == 0 {
		return nil, fmt.Errorf("no migrations are embedded")
	}
	s := &migrationScript{
		schema: pgx.Identifier{cfg.Schema}.Sanitize(),
		table:  pgx.Identifier{cfg.Schema, "outbox_schema_migrations"}.Sanitize(),
		lock:   `SELECT pg_advisory_xact_lock(hashtext(` + quoteLiteral("outbox-migrate:"+cfg.Schema) + `))`,
	}
	s.createSchema = `CREATE SCHEMA IF NOT EXISTS ` + s.schema
	s.createTable = `CREATE TABLE IF NOT EXISTS ` + s.table + ` (
	version    integer PRIMARY KEY,
	name       text NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now())`
	replacer := strings.NewReplacer(
		"{{schema}}", s.schema,
		"{{channel}}", quoteLiteral(Channel(cfg.Schema)),
	)
	for _, m := range migrations {
		s.steps = append(s.steps, migrationStep{
			Migration: m,
			apply:     replacer.Replace(m.SQL),
			record:    fmt.Sprintf(`INSERT INTO %s (version, name) VALUES (%d, %s)`, s.table, m.Version, quoteLiteral(m.Name)),
		})
	}
	return s, nil
}

func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// SetNotify turns the table's NOTIFY trigger on or off: on, every transaction that
// enqueues notifies the relays (relay.wakeup: notify); off, it does not, and the relays
// poll (relay.wakeup: poll, the default since migration 0008). It needs the table's owner,
// like Migrate. A trigger already in that state is left alone: ALTER TABLE would wait for
// the enqueuing transactions in flight and hold new ones back meanwhile.
func (s *Store) SetNotify(ctx context.Context, on bool) error {
	if state, err := s.NotifyEnabled(ctx); err == nil && state == on {
		return nil
	}
	verb := "DISABLE"
	if on {
		verb = "ENABLE"
	}
	if _, err := s.db.Exec(ctx, `ALTER TABLE `+s.messages+` `+verb+` TRIGGER outbox_messages_notify`); err != nil {
		return fmt.Errorf("%s the NOTIFY trigger: %w", strings.ToLower(verb), err)
	}
	return nil
}

// NotifyEnabled reports whether the table's NOTIFY trigger is on.
func (s *Store) NotifyEnabled(ctx context.Context) (bool, error) {
	var state string
	err := s.db.QueryRow(ctx, `SELECT tgenabled::text FROM pg_trigger WHERE tgrelid = $1::regclass AND tgname = 'outbox_messages_notify'`, s.messages).Scan(&state)
	if err != nil {
		return false, fmt.Errorf("read the NOTIFY trigger's state: %w", err)
	}
	return state != "D", nil
}
