package store

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

//go:embed migrations/*.up.sql
var migrationFiles embed.FS

var migrationName = regexp.MustCompile(`^(\d{4})_[a-z0-9_]+\.up\.sql$`)

// Migration is one numbered schema change.
type Migration struct {
	Version int
	Name    string
	SQL     string // with {{schema}} and {{channel}} still in place
}

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	var out []Migration
	for _, e := range entries {
		m := migrationName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("migration file %q does not match NNNN_name.up.sql", e.Name())
		}
		v, _ := strconv.Atoi(m[1])
		body, err := migrationFiles.ReadFile(path.Join("migrations", e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, Migration{Version: v, Name: e.Name(), SQL: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// Migrate creates the schema if needed and applies the migrations it has not applied yet,
// in one transaction under an advisory lock, so concurrent callers are safe and running it
// again is a no-op. It returns the versions it applied.
func (s *Store) Migrate(ctx context.Context) ([]int, error) {
	migrations, err := Migrations()
	if err != nil {
		return nil, err
	}
	schema := pgx.Identifier{s.cfg.Schema}.Sanitize()
	table := pgx.Identifier{s.cfg.Schema, "outbox_schema_migrations"}.Sanitize()
	replacer := strings.NewReplacer(
		"{{schema}}", schema,
		"{{channel}}", quoteLiteral(s.Channel()),
	)
	var applied []int
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "outbox-migrate:"+s.cfg.Schema); err != nil {
			return fmt.Errorf("take migration lock: %w", err)
		}
		if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+schema); err != nil {
			return fmt.Errorf("create schema %s: %w", schema, err)
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (
			version    integer PRIMARY KEY,
			name       text NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return fmt.Errorf("create migrations table: %w", err)
		}
		done := map[int]bool{}
		rows, err := tx.Query(ctx, `SELECT version FROM `+table)
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
		for _, m := range migrations {
			if done[m.Version] {
				continue
			}
			if _, err := tx.Exec(ctx, replacer.Replace(m.SQL)); err != nil {
				return fmt.Errorf("apply migration %s: %w", m.Name, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+table+` (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
				return fmt.Errorf("record migration %s: %w", m.Name, err)
			}
			applied = append(applied, m.Version)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("migrate schema %q: %w", s.cfg.Schema, err)
	}
	return applied, nil
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
