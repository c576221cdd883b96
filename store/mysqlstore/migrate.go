package mysqlstore

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/outbox-go/outbox/store/storedriver"
)

//go:embed migrations/*.up.sql
var migrationFiles embed.FS

// Migration is one numbered schema change. Its SQL is a mysql client script, whose
// DELIMITER lines set what ends a statement.
type Migration = storedriver.Migration

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	return storedriver.ReadMigrations(migrationFiles, "migrations")
}

// splitStatements splits a mysql client script into its statements: a statement ends at
// a line that ends with the delimiter (";" until a DELIMITER line changes it). Lines that
// are only a comment are left out.
func splitStatements(script string) []string {
	var (
		out   []string
		cur   strings.Builder
		delim = ";"
	)
	for _, line := range strings.Split(script, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case trimmed == "" && cur.Len() == 0, strings.HasPrefix(trimmed, "--"):
			continue
		case len(trimmed) > 10 && strings.EqualFold(trimmed[:10], "DELIMITER "):
			delim = strings.TrimSpace(trimmed[10:])
			continue
		}
		if strings.HasSuffix(trimmed, delim) {
			cur.WriteString(strings.TrimSuffix(strings.TrimRight(line, " \t\r"), delim))
			if stmt := strings.TrimSpace(cur.String()); stmt != "" {
				out = append(out, stmt)
			}
			cur.Reset()
			continue
		}
		cur.WriteString(line + "\n")
	}
	if stmt := strings.TrimSpace(cur.String()); stmt != "" {
		out = append(out, stmt)
	}
	return out
}

// MigrationLockTimeout is how long Migrate waits, in seconds, for another migration of the
// same database to finish.
const MigrationLockTimeout = 600

// Migrate creates the outbox tables in the store's database and applies the migrations
// not applied yet, and returns their versions; running it again is a no-op. MySQL commits
// each DDL statement on its own, so Migrate holds a named lock (GET_LOCK) while it runs,
// which makes concurrent migrations of one database wait for each other, and records
// after each statement how far a migration has got, so a migration that was interrupted
// resumes where it stopped (see migrations/0001_create_outbox.up.sql).
func (s *Store) Migrate(ctx context.Context) ([]int, error) {
	migrations, err := Migrations()
	if err != nil {
		return nil, fmt.Errorf("migrate database %s: %w", s.schema, err)
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate database %s: %w", s.schema, err)
	}
	defer conn.Close()
	lock := migrationLockName(s.schema)
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(?, ?)`, lock, MigrationLockTimeout).Scan(&got); err != nil {
		return nil, fmt.Errorf("migrate database %s: take the migration lock: %w", s.schema, err)
	}
	if !got.Valid || got.Int64 != 1 {
		return nil, fmt.Errorf("migrate database %s: another migration held the lock %q for %d seconds", s.schema, lock, MigrationLockTimeout)
	}
	defer func() {
		if _, err := conn.ExecContext(context.WithoutCancel(ctx), `DO RELEASE_LOCK(?)`, lock); err != nil {
			// The lock is the session's: a connection the pool discards takes it along.
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
	}()
	applied, err := s.migrate(ctx, conn, migrations)
	if err != nil {
		return applied, fmt.Errorf("migrate database %s: %w", s.schema, err)
	}
	return applied, nil
}

func (s *Store) migrate(ctx context.Context, conn *sql.Conn, migrations []Migration) ([]int, error) {
	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+s.migrations+` (
    version         INT          NOT NULL,
    name            VARCHAR(255) NOT NULL,
    statements_done INT          NOT NULL DEFAULT 0,
    applied_at      TIMESTAMP(6) NULL DEFAULT NULL,
    PRIMARY KEY (version)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_unicode_ci`); err != nil {
		return nil, fmt.Errorf("create the migrations table: %w", err)
	}
	type progress struct {
		done    int
		applied bool
	}
	state := map[int]progress{}
	rows, err := conn.QueryContext(ctx, `SELECT version, statements_done, applied_at IS NOT NULL FROM `+s.migrations)
	if err != nil {
		return nil, fmt.Errorf("read applied migrations: %w", err)
	}
	for rows.Next() {
		var v int
		var p progress
		if err := rows.Scan(&v, &p.done, &p.applied); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read applied migrations: %w", err)
		}
		state[v] = p
	}
	if err := rows.Close(); err != nil {
		return nil, fmt.Errorf("read applied migrations: %w", err)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read applied migrations: %w", err)
	}
	var binary string
	var applied []int
	for _, m := range migrations {
		p := state[m.Version]
		if p.applied {
			continue
		}
		if binary == "" {
			if binary, err = binaryCollation(ctx, conn); err != nil {
				return applied, err
			}
		}
		stmts := splitStatements(strings.NewReplacer("{{schema}}", quoteIdent(s.schema), "{{binary}}", binary).Replace(m.SQL))
		for i := p.done; i < len(stmts); i++ {
			if _, err := conn.ExecContext(ctx, stmts[i]); err != nil && !isErrNumber(err, errDuplicateColumn) {
				// A column that exists already was added by this statement before an
				// interruption: MySQL has no ADD COLUMN IF NOT EXISTS.
				return applied, fmt.Errorf("apply migration %s, statement %d of %d: %w", m.Name, i+1, len(stmts), err)
			}
			if _, err := conn.ExecContext(ctx, `INSERT INTO `+s.migrations+` (version, name, statements_done) VALUES (?, ?, ?)
ON DUPLICATE KEY UPDATE statements_done = ?`, m.Version, m.Name, i+1, i+1); err != nil {
				return applied, fmt.Errorf("record migration %s, statement %d: %w", m.Name, i+1, err)
			}
		}
		if _, err := conn.ExecContext(ctx, `INSERT INTO `+s.migrations+` (version, name, statements_done, applied_at) VALUES (?, ?, ?, NOW(6))
ON DUPLICATE KEY UPDATE applied_at = NOW(6)`, m.Version, m.Name, len(stmts)); err != nil {
			return applied, fmt.Errorf("record migration %s: %w", m.Name, err)
		}
		applied = append(applied, m.Version)
	}
	return applied, nil
}

// binaryCollation returns the utf8mb4 collation that compares bytes without padding
// trailing spaces: MySQL's utf8mb4_0900_bin or MariaDB's utf8mb4_nopad_bin, else
// utf8mb4_bin.
func binaryCollation(ctx context.Context, conn *sql.Conn) (string, error) {
	rows, err := conn.QueryContext(ctx, `SELECT COLLATION_NAME FROM information_schema.COLLATIONS
WHERE COLLATION_NAME IN ('utf8mb4_0900_bin', 'utf8mb4_nopad_bin')`)
	if err != nil {
		return "", fmt.Errorf("read the server's collations: %w", err)
	}
	defer rows.Close()
	have := map[string]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return "", fmt.Errorf("read the server's collations: %w", err)
		}
		have[name] = true
	}
	if err := rows.Err(); err != nil {
		return "", fmt.Errorf("read the server's collations: %w", err)
	}
	switch {
	case have["utf8mb4_0900_bin"]:
		return "utf8mb4_0900_bin", nil
	case have["utf8mb4_nopad_bin"]:
		return "utf8mb4_nopad_bin", nil
	}
	return "utf8mb4_bin", nil
}

// migrationLockName is the GET_LOCK name of a database's migrations; MySQL allows 64
// characters.
func migrationLockName(schema string) string {
	name := "outbox-migrate:" + schema
	if len(name) <= 64 {
		return name
	}
	sum := sha256.Sum256([]byte(schema))
	return "outbox-migrate:" + hex.EncodeToString(sum[:])[:40]
}

// errMissingTables is wrapped by errors that come from a database without the outbox
// tables.
var errMissingTables = errors.New("the outbox tables are missing: run outbox migrate")
